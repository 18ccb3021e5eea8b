import { Placer, type NodeLoad } from '../src/platform/index.ts';
import { hostInfo, type BenchOptions, type BenchReport } from './report.ts';

const NODES = 160;
const BURST = 32_000;
/** Placements between two polls of the nodes' loads (a 20 ms poll at 50K placements/s). */
const VIEW_REFRESH = 1_000;
const DEMAND = { backend: 'container' as const, memoryMib: 256 };

function cluster(): NodeLoad[] {
  return Array.from({ length: NODES }, (_, i) => ({
    nodeId: `n${i}`,
    healthy: true,
    backends: ['container'],
    sandboxes: 0,
    capacity: 3_200,
    memoryCommittedMib: 0,
    memoryCapacityMib: 2 * 1024 * 1024,
  }));
}

/**
 * Places the burst with `choose` over a view refreshed every VIEW_REFRESH placements, as a
 * controller sees the nodes; returns max/mean load and placements per second.
 */
function simulate(
  choose: (view: readonly NodeLoad[]) => NodeLoad,
  onRefresh: () => void = () => undefined,
): { maxOverMean: number; perSecond: number } {
  const truth = new Map<string, number>();
  let view = cluster();
  const started = performance.now();
  for (let i = 0; i < BURST; i++) {
    if (i > 0 && i % VIEW_REFRESH === 0) {
      view = view.map((node) => ({ ...node, sandboxes: truth.get(node.nodeId) ?? 0 }));
      onRefresh();
    }
    const node = choose(view);
    truth.set(node.nodeId, (truth.get(node.nodeId) ?? 0) + 1);
  }
  const seconds = (performance.now() - started) / 1000;
  const max = Math.max(...truth.values());
  return {
    maxOverMean: Math.round((max / (BURST / NODES)) * 1000) / 1000,
    perSecond: Math.round(BURST / seconds),
  };
}

/**
 * placement: a 32K-sandbox burst over 160 simulated nodes, in process. Power-of-two choices with
 * the in-flight overlay (what the controller does) against random placement and against
 * least-loaded on the same stale view without an overlay.
 */
export function benchPlacement(options: BenchOptions): Promise<BenchReport> {
  options.progress(
    `placement: ${BURST} placements over ${NODES} nodes, view refreshed every ${VIEW_REFRESH}`,
  );
  let placer = new Placer(2);
  const releases: (() => void)[] = [];
  // warm up the JIT before timing
  simulate((view) => placer.choose(view, DEMAND)!);
  placer = new Placer(2);
  const ours = simulate(
    (view) => {
      const node = placer.choose(view, DEMAND)!;
      releases.push(placer.reserve(node.nodeId, DEMAND));
      return node;
    },
    // the refreshed view includes every placement so far: the overlay forgets them
    () => releases.splice(0).forEach((release) => release()),
  );
  const random = simulate((view) => view[Math.floor(Math.random() * view.length)]!);
  const leastLoaded = simulate((view) =>
    view.reduce((best, node) => (node.sandboxes < best.sandboxes ? node : best)),
  );
  const ratio = (value: number, baseline: number): number => Math.round((value / baseline) * 1000) / 1000;
  return Promise.resolve({
    bench: 'placement',
    host: hostInfo(),
    metrics: {
      placements_per_second: { value: ours.perSecond, unit: 'placements/s' },
      max_over_mean_vs_random: {
        value: ours.maxOverMean,
        unit: 'x',
        baseline: random.maxOverMean,
        ratio: ratio(ours.maxOverMean, random.maxOverMean),
      },
      max_over_mean_vs_least_loaded_stale: {
        value: ours.maxOverMean,
        unit: 'x',
        baseline: leastLoaded.maxOverMean,
        ratio: ratio(ours.maxOverMean, leastLoaded.maxOverMean),
      },
    },
  });
}
