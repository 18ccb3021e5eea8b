import { BenchFixture } from './fixture.ts';
import { compared, hostInfo, quantile, usedKib, type BenchOptions, type BenchReport } from './report.ts';
import type { LocalPlatform, Sandbox } from '../src/platform/index.ts';

const LIVE = Number(process.env['SANDGYM_BENCH_DENSITY'] ?? 2_000);
const CONCURRENCY = 8;
const LATENCY_SAMPLES = 30;
const REQUEST = { environment: 'busybox:latest' };

async function settle(): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 3_000));
}

/** create→ready times, each sandbox closed right after (so a warm one goes back to its pool). */
async function createLatencies(platform: LocalPlatform): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < LATENCY_SAMPLES; i++) {
    const started = performance.now();
    const sandbox = await platform.createSandbox(REQUEST);
    samples.push(performance.now() - started);
    await sandbox.close();
  }
  return samples;
}

/**
 * density: live idle sandboxes up to 2,000 (SANDGYM_BENCH_DENSITY sets another count). Host memory
 * each costs (the rise of used memory, kernel memory included, page cache not), and create→ready
 * latency with all of them live against none live, both for creates from a warm pool (what a node
 * does) and for cold creates (which make new cgroups and namespaces, whose kernel cost is what
 * grows with the number of live sandboxes).
 */
export async function benchDensity(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  await using warm = await BenchFixture.create({ warmPool: { latency: 4 } }, 'warm');
  for (const platform of [fixture.platform, warm.platform])
    await (await platform.createSandbox(REQUEST)).close();
  await warm.platform.warmPool.filled();
  options.progress(`density: create latency with 0 live (${LATENCY_SAMPLES} samples, cold and warm)`);
  const atZero = await createLatencies(fixture.platform);
  const warmAtZero = await createLatencies(warm.platform);
  await settle();
  const before = usedKib();
  options.progress(`density: starting ${LIVE} idle sandboxes, ${CONCURRENCY} at a time`);
  const live: Sandbox[] = [];
  const started = performance.now();
  try {
    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next < LIVE) {
          next++;
          live.push(await fixture.platform.createSandbox(REQUEST));
          if (live.length % 250 === 0) options.progress(`density: ${live.length} live`);
        }
      }),
    );
    const startMs = performance.now() - started;
    await settle();
    const perSandboxKib = (usedKib() - before) / LIVE;
    options.progress(`density: create latency with ${LIVE} live (${LATENCY_SAMPLES} samples)`);
    const atLive = await createLatencies(fixture.platform);
    await warm.platform.warmPool.filled();
    const warmAtLive = await createLatencies(warm.platform);
    const stillAnswering = (await Promise.all(live.slice(0, 20).map((s) => s.exec(['true'])))).every(
      (r) => r.exitCode === 0,
    );
    return {
      bench: 'density',
      host: hostInfo(),
      metrics: {
        live_sandboxes: { value: LIVE, unit: 'sandboxes' },
        host_memory_per_sandbox_mib: { value: Math.round((perSandboxKib / 1024) * 1000) / 1000, unit: 'MiB' },
        [`warm_create_p50_ms_at_${LIVE}_live_vs_0_live`]: compared(
          quantile(warmAtLive, 0.5),
          quantile(warmAtZero, 0.5),
        ),
        [`warm_create_p99_ms_at_${LIVE}_live_vs_0_live`]: compared(
          quantile(warmAtLive, 0.99),
          quantile(warmAtZero, 0.99),
        ),
        [`cold_create_p50_ms_at_${LIVE}_live_vs_0_live`]: compared(
          quantile(atLive, 0.5),
          quantile(atZero, 0.5),
        ),
        [`cold_create_p99_ms_at_${LIVE}_live_vs_0_live`]: compared(
          quantile(atLive, 0.99),
          quantile(atZero, 0.99),
        ),
        start_all_per_s: { value: Math.round((LIVE / startMs) * 1000 * 10) / 10, unit: 'sandboxes/s' },
        live_sandboxes_still_answer: { value: stillAnswering ? 1 : 0, unit: 'bool' },
      },
    };
  } finally {
    options.progress(`density: closing ${live.length} sandboxes`);
    await Promise.all(live.map((s) => s.close()));
  }
}
