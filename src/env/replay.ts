import type { PlatformClient, SandboxAction, TrajectoryRecord } from '../platform/index.ts';
import type { SandboxObservation } from '../platform/index.ts';
import { SandboxEnv } from './sandbox-env.ts';
import type { StepResult } from './environment.ts';

/** What {@link replayTrajectory} found. */
export interface ReplayReport {
  steps: number;
  matched: boolean;
  /** The first step whose observation differed, with both sides. */
  mismatch?: { stepIndex: number; recorded: unknown; replayed: unknown };
}

/**
 * An observation as replays compare it: timing zeroed, since it differs run to run by nature;
 * everything else must match exactly.
 */
export function comparableObservation(observation: unknown): string {
  const o = observation as SandboxObservation;
  return JSON.stringify(o?.type === 'exec' ? { ...o, durationMs: 0 } : o);
}

/**
 * Deterministic replay: re-drives a fresh sandbox of `environment` with the actions of one logged
 * episode, in order, and reports whether every observation matches the recorded one.
 */
export async function replayTrajectory(
  platform: PlatformClient,
  environment: string,
  records: readonly TrajectoryRecord[],
): Promise<ReplayReport> {
  await using env = SandboxEnv.create(platform, { sandbox: { environment } });
  await env.reset();
  for (const [index, record] of [...records].sort((a, b) => a.stepIndex - b.stepIndex).entries()) {
    // as logged: an action, or an invalid one's record, which replays as the same observation
    const step = await env.step(record.action as SandboxAction);
    const recorded = (record.result as StepResult<SandboxObservation>).observation;
    if (comparableObservation(step.observation) !== comparableObservation(recorded)) {
      return {
        steps: index + 1,
        matched: false,
        mismatch: { stepIndex: record.stepIndex, recorded, replayed: step.observation },
      };
    }
  }
  return { steps: records.length, matched: true };
}
