import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runProgram } from '../src/backends/index.ts';

/**
 * Times a command with hyperfine, without a shell (-N), and returns each run's duration in ms.
 * hyperfine forks from a small process, so a baseline carries none of Node's spawn cost.
 */
export async function timeCommand(command: string, runs: number): Promise<number[]> {
  const dir = await mkdtemp(join(tmpdir(), 'sandgym-bench-'));
  try {
    const out = join(dir, 'result.json');
    await runProgram(
      'hyperfine',
      ['-N', '--warmup', '3', '--runs', String(runs), '--export-json', out, command],
      {
        timeoutMs: 10 * 60_000,
      },
    );
    const parsed = JSON.parse(await readFile(out, 'utf8')) as { results: { times: number[] }[] };
    return (parsed.results[0]?.times ?? []).map((seconds) => seconds * 1000);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
