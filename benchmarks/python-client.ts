import { join } from 'node:path';
import { packageRoot, runProgram } from '../src/backends/index.ts';

/** Debian's interpreter, where python3-grpcio and python3-msgpack install (not a pyenv's on PATH). */
export const PYTHON = '/usr/bin/python3';

/** What python/examples/bench_aio.py measured. */
export interface ConcurrentSteps {
  envs: number;
  steps: number;
  seconds: number;
  stepsPerSecond: number;
}

/**
 * Steps per second of `envs` envs stepping at once from one asyncio process (sandgym.aio,
 * python/examples/bench_aio.py), `rounds` rounds of one step each; undefined, with the reason on
 * stderr, when python3 lacks grpcio or msgpack.
 */
export async function pythonConcurrentSteps(
  url: string,
  token: string,
  envs: number,
  rounds: number,
): Promise<ConcurrentSteps | undefined> {
  const python = join(packageRoot(), 'python');
  try {
    const output = await runProgram(
      PYTHON,
      [join(python, 'examples', 'bench_aio.py'), url, String(envs), String(rounds)],
      // a thousand sandboxes take a minute or two to make on a small host
      { env: { ...process.env, PYTHONPATH: python, SANDGYM_TOKEN: token }, timeoutMs: 900_000 },
    );
    return JSON.parse(output) as ConcurrentSteps;
  } catch (error) {
    console.error(`remote-step: no Python asyncio figures: ${(error as Error).message}`);
    return undefined;
  }
}

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
