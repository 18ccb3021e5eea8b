import { benchCreate } from './create.ts';
import { benchExec } from './exec.ts';
import { benchLayers } from './layers.ts';
import { benchReplay } from './replay.ts';
import type { BenchOptions, BenchReport } from './report.ts';

/** Every benchmark by name, in the order `sandgym bench` runs them. */
export const BENCHMARKS: Record<string, (options: BenchOptions) => Promise<BenchReport>> = {
  create: benchCreate,
  exec: benchExec,
  layers: benchLayers,
  replay: benchReplay,
};

export type { BenchReport, BenchOptions, Metric } from './report.ts';
