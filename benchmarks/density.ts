import { BenchFixture } from './fixture.ts';
import { compared, hostInfo, quantile, usedKib, type BenchOptions, type BenchReport } from './report.ts';
import type { LocalPlatform, Sandbox } from '../src/platform/index.ts';
import { mountBenchLayers, pooledCreates, timedCreates } from './create-samples.ts';

const LIVE = Number(process.env['SANDGYM_BENCH_DENSITY'] ?? 2_000);
const CONCURRENCY = 8;
const LATENCY_SAMPLES = 30;
const REQUEST = { environment: 'busybox:latest' };

async function settle(): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 3_000));
}

interface Latencies {
  cold: number[];
  warm: number[];
  unpooled: number[];
}

/** Create latencies on pre-created shells (cold and warm, see pooledCreates) and with none (unpooled). */
async function latencies(unpooled: LocalPlatform, pooled: LocalPlatform): Promise<Latencies> {
  return {
    ...(await pooledCreates(pooled, LATENCY_SAMPLES)),
    unpooled: await timedCreates(unpooled, LATENCY_SAMPLES, (sandbox) => sandbox.close()),
  };
}

/** p50 and p99 of each kind of create with every sandbox live, against none live. */
function comparedAtLive(atLive: Latencies, atZero: Latencies): BenchReport['metrics'] {
  const metrics: BenchReport['metrics'] = {};
  for (const kind of ['cold', 'warm', 'unpooled'] as const) {
    for (const q of [0.5, 0.99]) {
      metrics[`${kind}_create_p${q * 100}_ms_at_${LIVE}_live_vs_0_live`] = compared(
        quantile(atLive[kind], q),
        quantile(atZero[kind], q),
      );
    }
  }
  return metrics;
}

/**
 * density: live idle sandboxes up to 2,000 (SANDGYM_BENCH_DENSITY sets another count). Host memory
 * each costs (the rise of used memory, kernel memory included, page cache not), and create→ready
 * latency with all of them live against none live: on pre-created shells, never used (cold) and
 * reused (warm), which is what a node does, and unpooled (crun makes new cgroups and namespaces,
 * whose kernel cost is what grows with the number of live sandboxes).
 */
export async function benchDensity(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  await using pooled = await BenchFixture.create({ warmPool: { latency: LATENCY_SAMPLES } }, 'pooled');
  for (const platform of [fixture.platform, pooled.platform]) await mountBenchLayers(platform);
  options.progress(
    `density: create latency with 0 live (${LATENCY_SAMPLES} samples each: cold, warm, unpooled)`,
  );
  const atZero = await latencies(fixture.platform, pooled.platform);
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
    options.progress(`density: create latency with ${LIVE} live`);
    const atLive = await latencies(fixture.platform, pooled.platform);
    const stillAnswering = (await Promise.all(live.slice(0, 20).map((s) => s.exec(['true'])))).every(
      (r) => r.exitCode === 0,
    );
    return {
      bench: 'density',
      host: hostInfo(),
      metrics: {
        live_sandboxes: { value: LIVE, unit: 'sandboxes' },
        host_memory_per_sandbox_mib: { value: Math.round((perSandboxKib / 1024) * 1000) / 1000, unit: 'MiB' },
        ...comparedAtLive(atLive, atZero),
        start_all_per_s: { value: Math.round((LIVE / startMs) * 1000 * 10) / 10, unit: 'sandboxes/s' },
        live_sandboxes_still_answer: { value: stillAnswering ? 1 : 0, unit: 'bool' },
      },
    };
  } finally {
    options.progress(`density: closing ${live.length} sandboxes`);
    await Promise.all(live.map((s) => s.close()));
  }
}
