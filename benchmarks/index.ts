import { benchCreate } from './create.ts';
import { benchExec } from './exec.ts';
import { benchLayers } from './layers.ts';
import { benchReplay } from './replay.ts';
import { benchPlacement } from './placement.ts';
import { benchRemoteStep } from './remote-step.ts';
import { benchStepLoad } from './step-load.ts';
import { benchPreempt } from './preempt.ts';
import { benchQos } from './qos.ts';
import { benchBurst } from './burst.ts';
import { benchDensity } from './density.ts';
import { benchFnCall } from './fncall.ts';
import { benchHibernate } from './hibernate.ts';
import { benchVm } from './vm.ts';
import { benchTasks } from './tasks.ts';
import { benchControlPlane } from './control-plane.ts';
import { benchClusterScale, CLUSTER_SCALE_FLAGS } from './cluster-scale.ts';
import { benchPeers } from './peers.ts';
import { benchEpisode } from './episode.ts';
import type { BenchOptions, BenchReport } from './report.ts';

/** Every benchmark by name, in the order `sandgym bench` runs them. */
export const BENCHMARKS: Record<string, (options: BenchOptions) => Promise<BenchReport>> = {
  create: benchCreate,
  exec: benchExec,
  layers: benchLayers,
  replay: benchReplay,
  placement: benchPlacement,
  'remote-step': benchRemoteStep,
  'step-load': benchStepLoad,
  'control-plane': benchControlPlane,
  'cluster-scale': benchClusterScale,
  preempt: benchPreempt,
  qos: benchQos,
  burst: benchBurst,
  density: benchDensity,
  fncall: benchFnCall,
  hibernate: benchHibernate,
  vm: benchVm,
  tasks: benchTasks,
  episode: benchEpisode,
  peers: benchPeers,
};

/** The `--NAME VALUE` flags of the benchmarks that take some. */
export const BENCH_FLAGS: Record<string, readonly string[]> = { 'cluster-scale': CLUSTER_SCALE_FLAGS };

export { reapDeadBenchRuns } from './residue.ts';
export type { BenchReport, BenchOptions, Metric } from './report.ts';
