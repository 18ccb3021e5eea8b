import { SandgymError } from '../common/index.ts';
import { divergence, type TrajectoryLog } from './trajectory-log.ts';

/** A step as a client sends it: which episode, which index, what to do. */
export interface StepRequest {
  episodeId: string;
  stepIndex: number;
  action: unknown;
}

/** Stable JSON: object keys sorted, so equal actions compare equal however they were built. */
function canonical(value: unknown): string {
  return JSON.stringify(value, (_, v: unknown) =>
    v && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Uint8Array)
      ? Object.fromEntries(
          Object.entries(v as Record<string, unknown>).sort(([a], [b]) => a.localeCompare(b)),
        )
      : v,
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
    const logged = episode.find((r) => r.stepIndex === request.stepIndex);
    if (logged) {
      if (canonical(logged.action) !== canonical(request.action)) {
        throw divergence(request.episodeId, request.stepIndex, logged.action, request.action);
      }
      return { result: logged.result as R, replayed: true };
    }
    const next = episode.length === 0 ? 0 : (episode[episode.length - 1]?.stepIndex ?? -1) + 1;
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
