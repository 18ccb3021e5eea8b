import type { FailureReason } from '../../common/index.ts';
import type { SandboxObservation, StepAction } from './actions.ts';
import type { StepSignals } from './step-signals.ts';

/**
 * How a step went for the platform: fine; an infrastructure failure; a verifier at fault; or a
 * task that cannot run as written (its environment does not build, its setup fails), which its
 * author must fix. The last three are never a reward of 0: rollouts mask or retry them.
 */
export type StepOutcome =
  | { kind: 'ok' }
  | { kind: 'infra_failure'; reason: FailureReason; message: string }
  | { kind: 'verifier_error'; message: string }
  | { kind: 'task_error'; message: string };

/** What a step's audit found, or why it could not look. */
export type StepAudit = StepSignals | { error: string };

/** How a step runs: not part of its action, so a retried step with other options still matches its log. */
export interface StepOptions {
  /**
   * Who every action runs as ("name", "uid", "name:group", "uid:gid"): commands and file calls
   * alike, with that user's rights and groups; default root.
   */
  user?: string;
  /** Absolute paths whose changes the step reports in its signals' `protectedChanges`. */
  protectedPaths?: readonly string[];
  /** The most a command of this step may run, whatever its action asks. */
  commandTimeoutCapMs?: number;
}

/** One step as a client sends it to the platform: which episode, which index, what to do. */
export interface StepRequest {
  episodeId: string;
  stepIndex: number;
  /** An action, or the record of an invalid one; the node reads whatever comes through stepActionOf. */
  action: StepAction;
  options?: StepOptions;
}

/** What a step came to, as its trajectory record keeps it. */
export interface StepRecordResult {
  observation: SandboxObservation;
  /** A sandbox step earns nothing by itself; a task's grading sets the reward. */
  reward: number;
  terminated: boolean;
  truncated: boolean;
  outcome: StepOutcome;
  /** The audit; absent when the platform failed the step (there was nothing sound to measure). */
  info: { signals?: StepAudit };
}

/** What the platform answers a step with. */
export interface StepReply {
  result: StepRecordResult;
  /** The step had run before (a retry, or another client): this is its recorded result. */
  replayed: boolean;
  /** The log's cap cut this step's long outputs in its record (the reply has them whole). */
  logCapped: boolean;
  startedAt: string;
  durationMs: number;
}
