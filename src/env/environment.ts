import type { FailureReason } from '../common/index.ts';

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

/** Cancellation for a call. */
export interface EnvCallOptions {
  signal?: AbortSignal;
  /**
   * The most a command of this step may run, whatever its action asks (what is left of an
   * agent's time budget). Not part of the action: a replayed step still matches its log.
   */
  commandTimeoutCapMs?: number;
}

/** Options for {@link Environment.reset}. */
export interface ResetOptions extends EnvCallOptions {
  seed?: number;
  options?: Record<string, unknown>;
}

/** What reset returns, as in Gymnasium. */
export interface ResetResult<Observation> {
  observation: Observation;
  info: Record<string, unknown>;
}

/** What step returns, as in Gymnasium, plus a typed outcome. */
export interface StepResult<Observation> {
  observation: Observation;
  reward: number;
  terminated: boolean;
  truncated: boolean;
  info: Record<string, unknown>;
  outcome: StepOutcome;
}

/** The gym contract every sandgym environment keeps. */
export interface Environment<Action, Observation> extends AsyncDisposable {
  reset(options?: ResetOptions): Promise<ResetResult<Observation>>;
  step(action: Action, options?: EnvCallOptions): Promise<StepResult<Observation>>;
  /** Idempotent; destroys what the environment created. */
  close(): Promise<void>;
}
