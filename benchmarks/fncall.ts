import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { BenchFixture } from './fixture.ts';
import { timeCommand } from './hyperfine.ts';
import { atATime, compared, hostInfo, quantile, type BenchOptions, type BenchReport } from './report.ts';

const CALLS = 500;
const SPAWNS = 300;
const CRUN_RUNS = 30;
const CONCURRENCY = 4;

const perSecond = (count: number, ms: number): number => (count / ms) * 1000;

async function rate(count: number, concurrency: number, call: () => Promise<unknown>): Promise<number> {
  const started = performance.now();
  await atATime(count, concurrency, call);
  return perSecond(count, performance.now() - started);
}

/**
 * fncall: calls per second of a small program (busybox `true`) through a FnCall sandbox, cleaned
 * between calls, against spawning the same binary on the host from this process (one at a time and
 * four at a time, as the calls), and against `crun run` per call.
 */
export async function benchFnCall(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  const sandbox = await fixture.platform.createSandbox({ backend: 'fncall', environment: 'busybox:latest' });
  try {
    for (let i = 0; i < 20; i++) await sandbox.exec(['true']); // workers up, layer mounted
    options.progress(`fncall: ${CALLS} calls, one at a time, then ${CONCURRENCY} at a time`);
    const call = async (): Promise<void> => {
      const result = await sandbox.exec(['true']);
      if (result.exitCode !== 0) throw new Error(`a call failed: ${result.stderr}`);
    };
    const fnSerial = await rate(CALLS, 1, call);
    const fnConcurrent = await rate(CALLS, CONCURRENCY, call);
    options.progress(`fncall: baseline, ${SPAWNS} host spawns of the same binary`);
    const run = promisify(execFile);
    const busybox = join(fixture.rootfs, 'bin', 'busybox');
    const spawnOnce = (): Promise<unknown> => run(busybox, ['true']);
    const spawnSerial = await rate(SPAWNS, 1, spawnOnce);
    const spawnConcurrent = await rate(SPAWNS, CONCURRENCY, spawnOnce);
    options.progress(`fncall: baseline, crun run per call (${CRUN_RUNS} runs)`);
    const crun = await timeCommand(
      `${fixture.crunPrefix} run --bundle ${fixture.bundle} ${fixture.containerId('fncall')}`,
      CRUN_RUNS,
    );
    const crunRate = 1000 / quantile(crun, 0.5);
    return {
      bench: 'fncall',
      host: hostInfo(),
      metrics: {
        calls_per_s_vs_host_spawn: compared(fnSerial, spawnSerial, 'calls/s'),
        [`calls_per_s_vs_host_spawn_${CONCURRENCY}_at_a_time`]: compared(
          fnConcurrent,
          spawnConcurrent,
          'calls/s',
        ),
        calls_per_s_vs_crun_run_per_call: compared(fnSerial, crunRate, 'calls/s'),
      },
    };
  } finally {
    await sandbox.close();
  }
}
