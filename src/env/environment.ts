import type { StepAudit, StepOutcome } from '../platform/index.ts';

export type { StepOutcome };

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

/** What every reset says besides its observation. */
export interface ResetInfo {
  episodeId: string;
  /** The sandbox the episode runs in. */
  sandboxId: string;
  seed?: number | null;
  /** The episode was taken over from a client that is gone (its steps replay from the log). */
  attached?: boolean;
}

/** What every step says besides its observation, reward and outcome. */
export interface StepInfo {
  episodeId: string;
  /** The step's index in its episode; -1 for a VectorEnv step that only reset (see `resetInfo`). */
  stepIndex: number;
  /** The step had run before (a retry, or another client): this is its recorded result. */
  replayed: boolean;
  /** The audit of the step (absent when the platform failed it, or it did not run). */
  signals?: StepAudit;
  /** When the step started on the platform, and how long it took there, in ms. */
  startedAt?: string;
  durationMs?: number;
  /**
   * Set on the step that hit a limit: {@link withStepLimit}'s steps, or a chat env's turns or
   * tokens.
   */
  truncatedBy?: 'step_limit' | 'turn_limit' | 'token_limit';
  /** Set by a VectorEnv that started the next episode in this step. */
  autoreset?: boolean;
  /** With `autoreset` in `same_step` mode: the ended episode's last observation and info. */
  finalObservation?: unknown;
  finalInfo?: StepInfo;
  /** With `autoreset` in `next_step` mode: the reset's info. */
  resetInfo?: ResetInfo;
}

/** What reset returns, as in Gymnasium. */
export interface ResetResult<Observation, Info extends ResetInfo = ResetInfo> {
  observation: Observation;
  info: Info;
}

/** What step returns, as in Gymnasium, plus a typed outcome. */
export interface StepResult<Observation, Info extends StepInfo = StepInfo> {
  observation: Observation;
  reward: number;
  terminated: boolean;
  truncated: boolean;
  info: Info;
  outcome: StepOutcome;
}

/** The gym contract every sandgym environment keeps. */
export interface Environment<
  Action,
  Observation,
  RInfo extends ResetInfo = ResetInfo,
  SInfo extends StepInfo = StepInfo,
> extends AsyncDisposable {
  reset(options?: ResetOptions): Promise<ResetResult<Observation, RInfo>>;
  step(action: Action, options?: EnvCallOptions): Promise<StepResult<Observation, SInfo>>;
  /** Idempotent; destroys what the environment created. */
  close(): Promise<void>;
}
