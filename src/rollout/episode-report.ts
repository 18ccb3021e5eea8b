import type { StepOutcome } from '../env/index.ts';

/** One task's evaluation. */
export interface EpisodeReport {
  task: string;
  reward: number;
  outcome: StepOutcome;
  steps: number;
  durationMs: number;
  tampered: string[];
  error?: string;
}

/** Progress of a batch: what a progress bar shows. */
export interface EvalProgress {
  done: number;
  running: number;
  failed: number;
  total: number;
  etaMs: number | undefined;
}
