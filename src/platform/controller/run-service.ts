import { SandgymError, isSandgymError } from '../../common/index.ts';
import type { RunLedger } from '../etcd/shared-runs.ts';
import type { RunStatus as RunStatusMessage } from '../runs.ts';
import {
  PROJECT_KEY,
  RUNS,
  register,
  type CallContext,
  type WireCallOptions,
  type WireClient,
} from '../wire/index.ts';
import type { NodeWatcher } from './node-watcher.ts';

/**
 * Runs live on the nodes: each run call goes to every reachable node. A node that does not
 * know the run has none of its sandboxes; a run no node knows is `not_found`. With etcd, the
 * run and its lease are also written there, in transactions, so a node that missed a call (or
 * joined later) catches up from etcd, and a lease lapses when etcd says so, for every node.
 */
export function runService(watcher: NodeWatcher, shared: RunLedger | undefined) {
  const everywhere = async <T>(
    call: CallContext,
    work: (node: WireClient<typeof RUNS>, options: WireCallOptions) => Promise<T>,
  ): Promise<T[]> => {
    const options = { signal: call.signal, metadata: { [PROJECT_KEY]: call.principal.project } };
    const answers = await Promise.all(
      watcher.reachableRunClients().map((node) =>
        work(node, options).catch((error: unknown) => {
          if (isSandgymError(error, 'not_found')) return undefined;
          throw error;
        }),
      ),
    );
    const known = answers.filter((answer): answer is Awaited<T> => answer !== undefined);
    if (known.length === 0)
      throw new SandgymError('not_found', 'No node knows this run: start it with platform.startRun()');
    return known;
  };
  const status = (answers: RunStatusMessage[]): RunStatusMessage => ({
    name: answers[0]!.name,
    phase: answers[0]!.phase,
    lapsed: answers.some((a) => a.lapsed),
    sandboxes: answers.reduce((sum, a) => sum + a.sandboxes, 0),
  });
  return register(RUNS, {
    StartRun: async (request, call) => {
      await shared?.start(call.principal.project, request);
      return status(await everywhere(call, (node, o) => node.call('StartRun', request, o)));
    },
    RenewLease: async (request, call) => {
      await shared?.renew(call.principal.project, request.name);
      return status(await everywhere(call, (node, o) => node.call('RenewLease', request, o)));
    },
    SetPhase: async (request, call) => {
      const reports = await everywhere(call, (node, o) => node.call('SetPhase', request, o));
      // after the nodes: one that missed the call applies the phase when etcd shows it
      await shared?.setPhase(call.principal.project, request.name, request.phase);
      return {
        phase: request.phase,
        paused: reports.flatMap((r) => r.paused),
        hibernated: reports.flatMap((r) => r.hibernated),
        resumed: reports.flatMap((r) => r.resumed),
        restoring: reports.flatMap((r) => r.restoring),
        busy: reports.flatMap((r) => r.busy),
        freedBytes: reports.reduce((sum, r) => sum + r.freedBytes, 0),
        keptMemory: reports.flatMap((r) => r.keptMemory),
      };
    },
    EndRun: async (request, call) => {
      const reports = await everywhere(call, (node, o) => node.call('EndRun', request, o));
      await shared?.end(call.principal.project, request.name);
      return { destroyed: reports.flatMap((r) => r.destroyed) };
    },
  });
}
