import { z } from 'zod';
import type { CallOptions } from '../backends/index.ts';
import { parseAt } from '../common/index.ts';
import type { PhaseOptions, PhaseReport, Run, RunManager, RunStatus, TrainingPhase } from './runs.ts';
import { expectedPhaseMs, type RUNS, type WireClient } from './wire/index.ts';

/** Validates {@link RunOptions} at the API boundary. */
export const runOptionsSchema = z.strictObject({
  name: z.string().regex(/^[a-z0-9][a-z0-9._-]{0,63}$/, 'run names are a-z, 0-9, ., _ and -'),
  leaseMs: z.number().int().min(100, 'leaseMs is at least 100'),
  ttlMs: z.number().int().min(0).optional(),
});

/** Validates {@link PhaseOptions} at the API boundary. */
const phaseOptionsSchema = z.strictObject({ expectedMs: expectedPhaseMs.optional() });

/** A run of the embedded platform (or of a node agent's own manager). */
export function localRun(manager: RunManager, project: string, name: string): Run {
  const run: Run = {
    name,
    renew: () => manager.renew(project, name),
    phase: async (phase: TrainingPhase, options: PhaseOptions = {}) =>
      manager.setPhase(project, name, phase, parseAt(phaseOptionsSchema, options, 'phase options')),
    end: () => manager.end(project, name),
    [Symbol.asyncDispose]: async () => {
      await run.end();
    },
  };
  return run;
}

/** A run of the cluster, over the Runs service. */
export function remoteRun(client: WireClient<typeof RUNS>, name: string, options: CallOptions = {}): Run {
  const run: Run = {
    name,
    renew: (): Promise<RunStatus> => client.call('RenewLease', { name }, options),
    phase: (phase: TrainingPhase, phaseOptions: PhaseOptions = {}): Promise<PhaseReport> =>
      client.call('SetPhase', { name, phase, ...phaseOptions }, options),
    end: () => client.call('EndRun', { name }, options),
    [Symbol.asyncDispose]: async () => {
      await run.end();
    },
  };
  return run;
}
