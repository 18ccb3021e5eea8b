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
  sandboxId?: string;
  episodeId?: string;
  /** Steps fast-forwarded from the trajectory log of an interrupted run, not run again. */
  replayedSteps?: number;
  /** Attempts to reach addresses the network policy denies (a fetch of the solution, say). */
  deniedEgress?: number;
  /**
   * What the verifiers reported: per-metric rewards of a reward.json, test statuses, an anomaly the
   * agent's changes caused, entries left out of its diff.
   */
  details?: Record<string, unknown>;
  /** What building the task's environment said: steps taken from cache, base images, fallbacks. */
  buildNotes?: string[];
  /** Set when the agent used up its time budget: the episode was graded as it stood then. */
  timeout?: { budgetMs: number };
}

/** Progress of a batch: what a progress bar shows. */
export interface EvalProgress {
  done: number;
  running: number;
  failed: number;
  total: number;
  etaMs: number | undefined;
}

/** One step of a rollout, as `steps$` emits it. */
export interface StepEvent {
  task: string;
  episodeId: string;
  stepIndex: number;
  /** The action's type: exec, write_file, submit... */
  action: string;
  reward: number;
  outcome: StepOutcome['kind'];
  durationMs: number;
}

/** A sandbox state change, as `lifecycle$` emits it. */
export interface LifecycleEvent {
  sandboxId: string;
  state: 'running' | 'paused' | 'hibernated' | 'stopped';
  /** The task whose episode the sandbox runs, in a rollout. */
  task?: string;
  /** What caused it, for changes a run made: `phase:train`, `end`. */
  cause?: string;
}
