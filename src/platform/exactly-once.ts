import { SandgymError } from '../common/index.ts';
import type { StepIntent, TrajectoryLog, TrajectoryRecord } from './trajectory-log.ts';

/** Which step of which episode, doing what. */
export interface StepKey {
  episodeId: string;
  stepIndex: number;
  action: unknown;
}

/** Structural equality of two decoded actions (key order does not matter), without serialising. */
export function sameValue(a: unknown, b: unknown): boolean {
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
export type StepLookup =
  | { kind: 'logged'; record: TrajectoryRecord }
  /** Started in a process that is gone, with no record: it may or may not have taken effect. */
  | { kind: 'started'; intent: StepIntent }
  | { kind: 'next' };

/** A sandbox's step log, wherever it lives: read-only, for audits, replays and reports. */
export interface StepLog {
  /** Every record, in order. */
  records(): Promise<readonly TrajectoryRecord[]>;
}

/**
 * The exactly-once rule: a step already logged returns its record (if the action matches, else
 * a `divergence`); a step that started without a record is `started`; the first step past the
 * tail may run; anything further ahead is refused.
 */
export function lookupStep(log: TrajectoryLog, request: StepKey): StepLookup {
  const episode = log.episode(request.episodeId);
  const logged = episode[request.stepIndex];
  const started = logged ? undefined : log.intent(request.episodeId, request.stepIndex);
  const previous = logged ?? started;
  // a frame whose action the log cut keeps its digest to compare with
  const matches =
    previous?.actionDigest === undefined
      ? sameValue(previous?.action, request.action)
      : previous.actionDigest === log.actionDigest(request.action);
  if (previous && !matches) {
    throw divergence(request.episodeId, request.stepIndex, previous.action, request.action);
  }
  if (logged) return { kind: 'logged', record: logged };
  if (started) return { kind: 'started', intent: started };
  if (request.stepIndex !== episode.length) {
    throw new SandgymError(
      'invalid_argument',
      `Step ${request.stepIndex} of episode ${request.episodeId} skips ahead: the next step the log can take is ${episode.length}`,
    );
  }
  return { kind: 'next' };
}

/** A step log over a trajectory log file in this process. */
export function localStepLog(log: TrajectoryLog): StepLog {
  return { records: () => Promise.resolve(log.records) };
}

/** Thrown when a step at a logged index asks for something other than what the log holds. */
function divergence(episodeId: string, stepIndex: number, logged: unknown, asked: unknown): SandgymError {
  return new SandgymError(
    'divergence',
    `Step ${stepIndex} of episode ${episodeId} diverges from the trajectory log: it logged ${JSON.stringify(logged)} but was asked ${JSON.stringify(asked)}`,
  );
}
