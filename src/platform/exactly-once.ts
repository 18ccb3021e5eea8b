import { SandgymError } from '../common/index.ts';
import type { TrajectoryLog, TrajectoryRecord } from './trajectory-log.ts';

/** A step as a client sends it: which episode, which index, what to do. */
export interface StepRequest {
  episodeId: string;
  stepIndex: number;
  action: unknown;
}

/** Structural equality of two decoded actions (key order does not matter), without serialising. */
function sameValue(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a))
    return Array.isArray(b) && a.length === b.length && a.every((v, i) => sameValue(v, b[i]));
  if (a instanceof Uint8Array) return b instanceof Uint8Array && Buffer.compare(a, b) === 0;
  const left = Object.entries(a).filter(([, v]) => v !== undefined);
  const right = b as Record<string, unknown>;
  return (
    left.length === Object.values(right).filter((v) => v !== undefined).length &&
    left.every(([k, v]) => sameValue(v, right[k]))
  );
}

/** Where a step stands in its episode's log. */
export type StepLookup = { logged: true; result: unknown } | { logged: false };

/**
 * A sandbox's step log, wherever it lives: in this process (embedded platform) or on the node
 * that runs the sandbox (cluster). {@link ExactlyOnceSteps} runs over either.
 */
export interface StepLog {
  /** The recorded result of a logged step, or that it is the next to run; throws otherwise. */
  lookup(request: StepRequest): Promise<StepLookup>;
  /** Makes a step's record durable; returns once it is, saying whether the log's cap cut its long strings. */
  append(record: TrajectoryRecord): Promise<{ capped: boolean }>;
  /** Every record, in order. */
  records(): Promise<readonly TrajectoryRecord[]>;
}

/**
 * The exactly-once rule: a step already logged returns its record (if the action matches, else
 * a `divergence`); the first step past the tail may run; anything further ahead is refused.
 */
export function lookupStep(log: TrajectoryLog, request: StepRequest): StepLookup {
  const episode = log.episode(request.episodeId);
  const logged = episode[request.stepIndex];
  if (logged) {
    if (!sameValue(logged.action, request.action)) {
      throw divergence(request.episodeId, request.stepIndex, logged.action, request.action);
    }
    return { logged: true, result: logged.result };
  }
  if (request.stepIndex !== episode.length) {
    throw new SandgymError(
      'invalid_argument',
      `Step ${request.stepIndex} of episode ${request.episodeId} skips ahead: the next step the log can take is ${episode.length}`,
    );
  }
  return { logged: false };
}

/**
 * Appends a step's record under the exactly-once rule: a record already there with the same
 * action is a no-op (a retried append), a different one is a `divergence`, a gap is refused.
 * Whoever skipped the lookup (see {@link ExactlyOnceSteps}) is still checked here.
 */
export async function appendStep(log: TrajectoryLog, record: TrajectoryRecord): Promise<{ capped: boolean }> {
  if (lookupStep(log, record).logged) return { capped: false };
  return log.append(record);
}

/** A step log over a trajectory log file in this process. */
export function localStepLog(log: TrajectoryLog): StepLog {
  return {
    lookup: (request) => Promise.resolve(lookupStep(log, request)),
    append: (record) => appendStep(log, record),
    records: () => Promise.resolve(log.records),
  };
}

/**
 * Exactly-once steps over a step log: a step already logged returns its recorded result
 * without running; a different action at a logged index is a `divergence`; the first step past
 * the tail runs for real and is logged before its result returns. So a client that crashed and
 * retries, or a new client that attaches, fast-forwards and never runs `git commit` twice.
 */
export class ExactlyOnceSteps {
  /** Per episode, the step index this client knows to be the log's tail (it wrote the one before). */
  private readonly tails = new Map<string, number>();

  constructor(private readonly log: StepLog) {}

  /**
   * Declares an episode this client starts on a fresh sandbox, whose log is empty: its steps
   * skip the lookup (one round trip less when the log is remote). The append still checks.
   */
  startEpisode(episodeId: string): void {
    this.tails.set(episodeId, 0);
  }

  async run<R>(
    request: StepRequest,
    execute: () => Promise<R>,
  ): Promise<{ result: R; replayed: boolean; logCapped?: boolean }> {
    if (this.tails.get(request.episodeId) !== request.stepIndex) {
      const found = await this.log.lookup(request);
      if (found.logged) return { result: found.result as R, replayed: true };
    }
    const startedAt = new Date().toISOString();
    const started = performance.now();
    const result = await execute();
    const { capped } = await this.log.append({
      episodeId: request.episodeId,
      stepIndex: request.stepIndex,
      action: request.action,
      result,
      startedAt,
      durationMs: performance.now() - started,
    });
    this.tails.set(request.episodeId, request.stepIndex + 1);
    return { result, replayed: false, ...(capped ? { logCapped: true } : {}) };
  }
}

/** Thrown when a step at a logged index asks for something other than what the log holds. */
export function divergence(
  episodeId: string,
  stepIndex: number,
  logged: unknown,
  asked: unknown,
): SandgymError {
  return new SandgymError(
    'divergence',
    `Step ${stepIndex} of episode ${episodeId} diverges from the trajectory log: it logged ${JSON.stringify(logged)} but was asked ${JSON.stringify(asked)}`,
  );
}
