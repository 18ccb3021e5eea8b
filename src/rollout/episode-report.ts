import type { ModelTurn } from './model-turn.ts';
import type { EpisodeTimings, StepAction, StepAudit, StepOutcome, TaskObservation } from '../env/index.ts';

/** One task's evaluation. */
export interface EpisodeReport {
  task: string;
  reward: number;
  outcome: StepOutcome;
  steps: number;
  durationMs: number;
  tampered: string[];
  error?: string;
  /**
   * Why the agent (the policy) failed to decide, when it did: its model's answer was unusable,
   * or its decision was not sane (see AgentError). The episode ended there and scored 0.
   */
  agentFailure?: string;
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
  /**
   * Where the episode's time went, by phase (see EPISODE_PHASES): the environment, the agent's
   * sandbox, staging, each step's agent, platform and command time, grading, teardown.
   */
  timings?: EpisodeTimings;
  /** What the platform added: every phase but the task's and the agent's own (see overheadMs). */
  overheadMs?: number;
  /** Every step of the episode, in order. */
  trajectory?: StepEvent[];
}

/** Progress of a batch: what a progress bar shows. */
export interface EvalProgress {
  done: number;
  running: number;
  failed: number;
  total: number;
  etaMs: number | undefined;
}

/** What a model spent on one step's decision, as its endpoint reported it. */
export interface TokenUsage {
  promptTokens: number;
  completionTokens: number;
}

/** One step of a rollout, as `steps$` emits it and an episode's `trajectory` keeps it. */
export interface StepEvent {
  task: string;
  episodeId: string;
  stepIndex: number;
  /** What the agent chose, or the record of what it gave that was not an action. */
  action: StepAction;
  observation: TaskObservation;
  reward: number;
  outcome: StepOutcome;
  /** The step's audit on the platform: denied egress, protected paths touched, limits hit. */
  signals?: StepAudit;
  /** Answered from the trajectory log (a taken-over episode), not run again. */
  replayed: boolean;
  /** When the step started on the platform. */
  startedAt?: string;
  /** The whole step as the rollout saw it (round trip included), in ms. */
  durationMs: number;
  /** The step on the platform alone, in ms. */
  platformMs?: number;
  /** How long the agent took to decide this step (a model's think time), in ms. */
  agentMs?: number;
  /** What the agent's model spent to choose this action (LLM agents). */
  usage?: TokenUsage;
  /** What the agent said besides its action (an LLM's message), if anything. */
  agentMessage?: string;
  /** The model turns the agent took to choose this action (see AgentDecision). */
  turns?: ModelTurn[];
  /** The model's tool call this step ran, by the model's id (see AgentDecision). */
  callId?: string;
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
