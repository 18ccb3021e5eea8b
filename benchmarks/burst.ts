import { BenchFixture } from './fixture.ts';
import { mountBenchLayers } from './create-samples.ts';
import { atATime, compared, hostInfo, type BenchOptions, type BenchReport } from './report.ts';

const SANDBOXES = 1_000;
const CONCURRENCY = 16;
/** Naive creation runs at a flat rate whatever the count (host-notes), so fewer suffice for it. */
const NAIVE_CONTAINERS = 300;
const REQUEST = { environment: 'busybox:latest' };

const ROUNDS = 3;

const perSecond = (count: number, ms: number): number => (count / ms) * 1000;

/** One round: the burst from a full pool, every sandbox closed, the pool refilled, then the naive starts. */
async function burstRound(
  fixture: BenchFixture,
  round: number,
  options: BenchOptions,
): Promise<{ burstMs: number; fromPool: number; closeMs: number; naiveMs: number }> {
  const { platform } = fixture;
  await platform.warmPool.filled();
  options.progress(`burst: round ${round}: ${SANDBOXES} creates, ${CONCURRENCY} at a time`);
  let started = performance.now();
  const sandboxes = await atATime(SANDBOXES, CONCURRENCY, () => platform.createSandbox(REQUEST));
  const burstMs = performance.now() - started;
  const fromPool = SANDBOXES - platform.warmPool.ready.latency;
  options.progress(`burst: round ${round}: closing ${SANDBOXES} sandboxes`);
  started = performance.now();
  await Promise.all(sandboxes.map((s) => s.close()));
  const closeMs = performance.now() - started;
  // the pool refills 1,000 shells after the close: the baseline must not run against that load
  await platform.warmPool.filled();
  options.progress(
    `burst: round ${round}: ${NAIVE_CONTAINERS} naive crun run --detach, ${CONCURRENCY} at a time`,
  );
  const naiveMs = await fixture.naiveCrunStarts(NAIVE_CONTAINERS, CONCURRENCY);
  return { burstMs, fromPool, closeMs, naiveMs };
}

/**
 * burst: 1,000 creates at once, time until every sandbox is ready (its agent answers), served from
 * a warm pool that was filled beforehand, against naive `crun run --detach` starts in the same
 * round; three rounds in a row, each reported. Also reports the cold rate at which the pool filled.
 */
export async function benchBurst(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create({ warmPool: { latency: SANDBOXES } });
  const { platform } = fixture;
  options.progress(`burst: filling the warm pool with ${SANDBOXES} shells (cold starts, before the bursts)`);
  const started = performance.now();
  await platform.warmPool.filled();
  const fillMs = performance.now() - started;
  // the layer's first mount (and its digest check) is not part of a burst on a busy node
  await mountBenchLayers(platform);

  const metrics: BenchReport['metrics'] = {};
  const ratios: number[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    const { burstMs, fromPool, closeMs, naiveMs } = await burstRound(fixture, round, options);
    const burst = compared(
      perSecond(SANDBOXES, burstMs),
      perSecond(NAIVE_CONTAINERS, naiveMs),
      'sandboxes/s',
    );
    ratios.push(burst.ratio ?? 0);
    metrics[`burst_ready_per_s_vs_naive_crun_round_${round}`] = burst;
    metrics[`burst_all_ready_ms_round_${round}`] = { value: Math.round(burstMs), unit: 'ms' };
    metrics[`burst_served_warm_round_${round}`] = { value: Math.min(SANDBOXES, fromPool), unit: 'sandboxes' };
    metrics[`close_per_s_round_${round}`] = {
      value: Math.round(perSecond(SANDBOXES, closeMs) * 10) / 10,
      unit: 'sandboxes/s',
    };
  }
  return {
    bench: 'burst',
    host: hostInfo(),
    metrics: {
      ...metrics,
      burst_lowest_ratio_of_rounds: { value: Math.min(...ratios), unit: 'x naive' },
      cold_refill_per_s: { value: Math.round(perSecond(SANDBOXES, fillMs) * 10) / 10, unit: 'sandboxes/s' },
    },
  };
}
