import { resolve } from 'node:path';
import { rm } from 'node:fs/promises';
import type { BackendName } from '../src/backends/index.ts';
import {
  Platform,
  defaultDataDir,
  defaultStoreDir,
  type LocalPlatform,
  type Sandbox,
  type SandboxRequest,
} from '../src/platform/index.ts';
import { mountBenchLayers } from './create-samples.ts';
import { BenchFixture } from './fixture.ts';
import { compared, hostInfo, quantile, type BenchOptions, type BenchReport, type Metric } from './report.ts';

/** Memory each sandbox holds: anonymous memory of a process, which only a memory snapshot frees whole. */
const HOLD_MIB = 16;

/** Hibernate-then-first-step rounds on one sandbox at a time, and creates they are set against. */
const SAMPLES = Number(process.env['SANDGYM_BENCH_PREEMPT_SAMPLES'] ?? 10);

/** The sandboxes of each backend: as many containers as a small node runs idle, a few TCG microVMs. */
const FLEETS: { backend: BackendName; count: number; memoryMib: number }[] = [
  { backend: 'container', count: Number(process.env['SANDGYM_BENCH_PREEMPT'] ?? 32), memoryMib: 128 },
  { backend: 'microvm', count: Number(process.env['SANDGYM_BENCH_PREEMPT_VMS'] ?? 4), memoryMib: 256 },
];

/**
 * preempt: N live sandboxes of a run per backend, each with a process holding memory. Times
 * phase('preempted') and the memory it freed (what the sandboxes' own measure shows before and
 * after, kernel memory included), then phase('rollout') plus the first step after it, against
 * the naive answer to preemption: destroying the sandboxes and creating them again (which loses
 * their processes). And for one sandbox: its first request while hibernated, against creating
 * a fresh one and running that request there.
 */
export async function benchPreempt(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-preempt-${process.pid}`);
  const platform = await Platform.local({ dataDir, storeDir: defaultStoreDir(base) });
  const metrics: Record<string, Metric> = {};
  try {
    for (const fleet of FLEETS) {
      if (fleet.count > 0) Object.assign(metrics, await preemptFleet(platform, fleet, options));
    }
    return { bench: 'preempt', host: hostInfo(), metrics };
  } finally {
    await platform.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}

async function preemptFleet(
  platform: LocalPlatform,
  fleet: (typeof FLEETS)[number],
  options: BenchOptions,
): Promise<Record<string, Metric>> {
  const { backend, count } = fleet;
  const request: SandboxRequest = {
    backend,
    environment: 'busybox:latest',
    resources: { memoryMib: fleet.memoryMib },
  };
  const run = await platform.startRun({ name: `bench-preempt-${backend}`, leaseMs: 30 * 60_000 });
  const sandboxes: Sandbox[] = [];
  try {
    options.progress(`preempt: ${count} ${backend} sandboxes, each holding ${HOLD_MIB} MiB`);
    for (let i = 0; i < count; i++) {
      const sandbox = await platform.createSandbox({ ...request, run: run.name });
      sandboxes.push(sandbox);
      await holdMemory(sandbox, HOLD_MIB);
    }
    const used = async (): Promise<number> =>
      (await Promise.all(sandboxes.map((s) => s.stats()))).reduce((sum, s) => sum + s.memoryBytes, 0);
    const before = await used();
    let started = performance.now();
    const report = await run.phase('preempted');
    const preemptMs = performance.now() - started;
    const after = await used();
    started = performance.now();
    const rollout = await run.phase('rollout');
    const rolloutMs = performance.now() - started;
    await sandboxes[0]!.exec(['true']);
    const backMs = performance.now() - started;
    // the restores the rollout left running, until every sandbox has answered a request
    await Promise.all(sandboxes.map((s) => s.exec(['true'])));
    const allBackMs = performance.now() - started;
    options.progress(`preempt: ${SAMPLES} first steps of one hibernated ${backend} sandbox, and creates`);
    // one sandbox alone: a request to it while hibernated, against creating a fresh one for it
    const wakes: number[] = [];
    const creates: number[] = [];
    for (let i = 0; i < SAMPLES; i++) {
      const sandbox = sandboxes[i % count]!;
      await sandbox.hibernate();
      started = performance.now();
      await sandbox.exec(['true']);
      wakes.push(performance.now() - started);
      started = performance.now();
      const fresh = await platform.createSandbox(request);
      await fresh.exec(['true']);
      creates.push(performance.now() - started);
      await fresh.close();
    }
    options.progress(`preempt: baseline, destroying and recreating ${count} ${backend} sandboxes`);
    started = performance.now();
    await Promise.all(sandboxes.splice(0).map((s) => s.close()));
    for (let i = 0; i < count; i++) sandboxes.push(await platform.createSandbox(request));
    await sandboxes[0]!.exec(['true']);
    const recreateMs = performance.now() - started;
    const round = (n: number): number => Math.round(n * 10) / 10;
    const mib = (bytes: number): number => round(bytes / 2 ** 20);
    return {
      [`${backend}_preempt_ms`]: { value: round(preemptMs), unit: 'ms' },
      [`${backend}_memory_before_mib`]: { value: mib(before), unit: 'MiB' },
      [`${backend}_memory_after_mib`]: { value: mib(after), unit: 'MiB' },
      [`${backend}_memory_freed_percent`]: { value: round((100 * (before - after)) / before), unit: '%' },
      [`${backend}_hibernated`]: { value: report.hibernated.length, unit: 'sandboxes' },
      [`${backend}_rollout_call_ms`]: { value: round(rolloutMs), unit: 'ms' },
      [`${backend}_restoring_after_rollout`]: { value: rollout.restoring.length, unit: 'sandboxes' },
      [`${backend}_first_step_after_rollout_ms_vs_recreate`]: compared(backMs, recreateMs),
      [`${backend}_all_back_after_rollout_ms_vs_recreate`]: compared(allBackMs, recreateMs),
      [`${backend}_first_step_of_one_hibernated_p50_ms_vs_create`]: compared(
        quantile(wakes, 0.5),
        quantile(creates, 0.5),
      ),
      ...(backend === 'container'
        ? {
            container_first_step_of_one_hibernated_p50_ms_vs_pooled_create: compared(
              quantile(wakes, 0.5),
              quantile(await pooledFirstSteps(options), 0.5),
            ),
          }
        : {}),
    };
  } finally {
    await Promise.all(sandboxes.map((s) => s.close().catch(() => undefined)));
    await run.end();
  }
}

/** Starts a process in the sandbox that holds `mib` MiB of anonymous memory until it is killed. */
async function holdMemory(sandbox: Sandbox, mib: number): Promise<void> {
  await sandbox.exec([
    'sh',
    '-c',
    `sh -c 'x=$(head -c ${mib * 1024 * 1024} /dev/zero | tr "\\0" a); touch /tmp/held; while true; do sleep 60; done' >/dev/null 2>&1 &`,
  ]);
  for (let polls = 0; (await sandbox.exec(['test', '-e', '/tmp/held'])).exitCode !== 0; polls++) {
    if (polls > 300) throw new Error(`sandbox ${sandbox.id} never filled its memory`);
    await new Promise((done) => setTimeout(done, 100));
  }
}

/**
 * Create plus first step of containers on pre-created shells (the warm pool's): the fastest
 * way to a fresh sandbox, which a restore is set against. Each is kept live until all are
 * timed, so that every create takes a shell the pool made ahead.
 */
async function pooledFirstSteps(options: BenchOptions): Promise<number[]> {
  await using pooled = await BenchFixture.create({ warmPool: { latency: SAMPLES } }, 'preempt-pooled');
  await mountBenchLayers(pooled.platform);
  options.progress(`preempt: ${SAMPLES} creates and first steps on pre-created shells`);
  await pooled.platform.warmPool.filled();
  const live: Sandbox[] = [];
  const samples: number[] = [];
  try {
    for (let i = 0; i < SAMPLES; i++) {
      const started = performance.now();
      const sandbox = await pooled.platform.createSandbox({ environment: 'busybox:latest' });
      live.push(sandbox);
      await sandbox.exec(['true']);
      samples.push(performance.now() - started);
    }
  } finally {
    await Promise.all(live.map((sandbox) => sandbox.close()));
  }
  return samples;
}
