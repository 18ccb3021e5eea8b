import { SandgymError } from '../common/index.ts';
import { divergence, type TrajectoryLog } from './trajectory-log.ts';

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

/**
 * Exactly-once steps over a trajectory log: a step already logged returns its recorded result
 * without running; a different action at a logged index is a `divergence`; the first step past
 * the tail runs for real and is logged before its result returns. So a client that crashed and
 * retries, or a new client that attaches, fast-forwards and never runs `git commit` twice.
 */
export class ExactlyOnceSteps {
  constructor(private readonly log: TrajectoryLog) {}

  async run<R>(request: StepRequest, execute: () => Promise<R>): Promise<{ result: R; replayed: boolean }> {
    const episode = this.log.episode(request.episodeId);
    const logged = episode[request.stepIndex];
    if (logged) {
      if (!sameValue(logged.action, request.action)) {
        throw divergence(request.episodeId, request.stepIndex, logged.action, request.action);
      }
      return { result: logged.result as R, replayed: true };
    }
    const next = episode.length;
    if (request.stepIndex !== next) {
      throw new SandgymError(
        'invalid_argument',
        `Step ${request.stepIndex} of episode ${request.episodeId} skips ahead: the next step the log can take is ${next}`,
      );
    }
    const startedAt = new Date().toISOString();
    const started = performance.now();
    const result = await execute();
    await this.log.append({
      episodeId: request.episodeId,
      stepIndex: request.stepIndex,
      action: request.action,
      result,
      startedAt,
      durationMs: performance.now() - started,
    });
    return { result, replayed: false };
  }
}
