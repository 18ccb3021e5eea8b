import { resolve } from 'node:path';
import { rm } from 'node:fs/promises';
import { Platform, defaultDataDir, defaultStoreDir, type Sandbox } from '../src/platform/index.ts';
import { hostInfo, type BenchOptions, type BenchReport } from './report.ts';

const SANDBOXES = 32;
const FILL_MIB = 16;
const REQUEST = { environment: 'busybox:latest', resources: { memoryMib: 128 } };

/**
 * preempt: N live sandboxes of a run, each holding memory (a file it wrote, in the page cache).
 * Times phase('preempted') (freeze and reclaim), the memory it freed, and phase('rollout') plus
 * the first step after it, against the naive answer to preemption: destroying the sandboxes and
 * creating them again.
 */
export async function benchPreempt(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-preempt-${process.pid}`);
  const platform = await Platform.local({ dataDir, storeDir: defaultStoreDir(base) });
  try {
    const run = await platform.startRun({ name: 'bench-preempt', leaseMs: 10 * 60_000 });
    options.progress(`preempt: ${SANDBOXES} sandboxes holding ${FILL_MIB} MiB each`);
    const sandboxes: Sandbox[] = [];
    for (let i = 0; i < SANDBOXES; i++) {
      const sandbox = await platform.createSandbox({ ...REQUEST, run: run.name });
      await sandbox.exec(['sh', '-c', `head -c ${FILL_MIB * 1024 * 1024} /dev/zero > /tmp/fill`]);
      sandboxes.push(sandbox);
    }
    const used = async (): Promise<number> =>
      (await Promise.all(sandboxes.map((s) => s.stats()))).reduce((sum, s) => sum + s.memoryBytes, 0);
    const before = await used();
    let started = performance.now();
    const report = await run.phase('preempted');
    const preemptMs = performance.now() - started;
    const after = await used();
    started = performance.now();
    await run.phase('rollout');
    await sandboxes[0]!.exec(['true']);
    const backMs = performance.now() - started;
    options.progress(`preempt: baseline, destroying and recreating ${SANDBOXES} sandboxes`);
    started = performance.now();
    await Promise.all(sandboxes.map((s) => s.close()));
    for (let i = 0; i < SANDBOXES; i++) {
      const sandbox = await platform.createSandbox(REQUEST);
      sandboxes[i] = sandbox;
    }
    await sandboxes[0]!.exec(['true']);
    const recreateMs = performance.now() - started;
    await run.end();
    const round = (n: number): number => Math.round(n * 10) / 10;
    const mib = (bytes: number): number => round(bytes / 1024 / 1024);
    return {
      bench: 'preempt',
      host: hostInfo(),
      metrics: {
        preempt_ms: { value: round(preemptMs), unit: 'ms' },
        memory_before_mib: { value: mib(before), unit: 'MiB' },
        memory_freed_mib: { value: mib(Math.max(0, before - after)), unit: 'MiB' },
        reported_freed_mib: { value: mib(report.freedBytes), unit: 'MiB' },
        first_step_after_rollout_ms_vs_recreate: {
          value: round(backMs),
          unit: 'ms',
          baseline: round(recreateMs),
          ratio: Math.round((backMs / recreateMs) * 1000) / 1000,
        },
      },
    };
  } finally {
    await platform.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}
