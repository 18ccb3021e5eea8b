import { join } from 'node:path';
import { packageRoot, runProgram } from '../src/backends/index.ts';

/** Debian's interpreter, where python3-grpcio and python3-msgpack install (not a pyenv's on PATH). */
export const PYTHON = '/usr/bin/python3';

/**
 * Env steps of `true` from the Python client (python/examples/bench_steps.py) against a node, in
 * ms; undefined, with the reason on stderr, when python3 lacks grpcio or msgpack.
 */
export async function pythonStepTimes(
  url: string,
  token: string,
  steps: number,
  warmup: number,
): Promise<number[] | undefined> {
  const python = join(packageRoot(), 'python');
  try {
    const output = await runProgram(
      PYTHON,
      [join(python, 'examples', 'bench_steps.py'), url, String(steps), String(warmup)],
      { env: { ...process.env, PYTHONPATH: python, SANDGYM_TOKEN: token } },
    );
    return (JSON.parse(output) as { times: number[] }).times;
  } catch (error) {
    console.error(`remote-step: no Python client figures: ${(error as Error).message}`);
    return undefined;
  }
}
