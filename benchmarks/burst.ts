import { BenchFixture } from './fixture.ts';
import { atATime, compared, hostInfo, type BenchOptions, type BenchReport } from './report.ts';

const SANDBOXES = 1_000;
const CONCURRENCY = 16;
/** Naive creation runs at a flat rate whatever the count (host-notes), so fewer suffice for it. */
const NAIVE_CONTAINERS = 300;
const REQUEST = { environment: 'busybox:latest' };

/**
 * burst: 1,000 creates at once, time until every sandbox is ready (its agent answers), served from
 * a warm pool that was filled beforehand, against naive `crun run --detach` starts in the same run.
 * Also reports the cold rate at which the pool filled.
 */
export async function benchBurst(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create({ warmPool: { latency: SANDBOXES } });
  const { platform } = fixture;
  options.progress(`burst: filling the warm pool with ${SANDBOXES} shells (cold starts, before the burst)`);
  let started = performance.now();
  await platform.warmPool.filled();
  const fillMs = performance.now() - started;
  // the layer's first mount (and its digest check) is not part of a burst on a busy node
  await (await platform.createSandbox(REQUEST)).close();
  await platform.warmPool.filled();

  options.progress(`burst: ${SANDBOXES} creates, ${CONCURRENCY} at a time`);
  started = performance.now();
  const sandboxes = await atATime(SANDBOXES, CONCURRENCY, () => platform.createSandbox(REQUEST));
  const burstMs = performance.now() - started;
  const fromPool = SANDBOXES - platform.warmPool.ready.latency;
  options.progress(`burst: closing ${SANDBOXES} sandboxes`);
  started = performance.now();
  await Promise.all(sandboxes.map((s) => s.close()));
  const closeMs = performance.now() - started;

  options.progress(`burst: baseline, ${NAIVE_CONTAINERS} naive crun run --detach, ${CONCURRENCY} at a time`);
  const naiveMs = await fixture.naiveCrunStarts(NAIVE_CONTAINERS, CONCURRENCY);
  const perSecond = (count: number, ms: number): number => (count / ms) * 1000;
  return {
    bench: 'burst',
    host: hostInfo(),
    metrics: {
      burst_ready_per_s_vs_naive_crun: compared(
        perSecond(SANDBOXES, burstMs),
        perSecond(NAIVE_CONTAINERS, naiveMs),
        'sandboxes/s',
      ),
      burst_all_ready_ms: { value: Math.round(burstMs), unit: 'ms' },
      burst_served_warm: { value: Math.min(SANDBOXES, fromPool), unit: 'sandboxes' },
      cold_refill_per_s: { value: Math.round(perSecond(SANDBOXES, fillMs) * 10) / 10, unit: 'sandboxes/s' },
      close_per_s: { value: Math.round(perSecond(SANDBOXES, closeMs) * 10) / 10, unit: 'sandboxes/s' },
    },
  };
}
