import { nodeOfEnvId } from '../../common/index.ts';
import {
  ENVS,
  PROJECT_KEY,
  register,
  type CallContext,
  type EnvSpec,
  type WireCallOptions,
} from '../wire/index.ts';
import type { NodeWatcher } from './node-watcher.ts';

/** What a node answers a Make with. */
interface EnvHandle {
  envId: string;
  kind: EnvSpec['kind'];
}

/**
 * The Envs service of a controller: a Make is placed like a create (the caller's quota, its
 * network grant, a node with room: see `make`), and every other call goes to the node its env id
 * names, acting for the caller's project, so that node's resolver refuses another project's env
 * as one never made. The controller keeps nothing of an env.
 */
export function envRouting(
  watcher: NodeWatcher,
  make: (request: { spec: EnvSpec; beside?: string | undefined }, call: CallContext) => Promise<EnvHandle>,
) {
  const route = (envId: string) => watcher.envClientOf(nodeOfEnvId(envId), `env ${envId}`);
  const as = (call: CallContext): WireCallOptions => ({
    signal: call.signal,
    metadata: { [PROJECT_KEY]: call.principal.project },
  });
  return register(ENVS, {
    Make: (request, call) => make(request, call),
    Reset: (request, call) => route(request.envId).call('Reset', request, as(call)),
    Step: (request, call) => route(request.envId).call('Step', request, as(call)),
    Checkpoint: (request, call) => route(request.envId).call('Checkpoint', request, as(call)),
    Restore: (request, call) => route(request.envId).call('Restore', request, as(call)),
    ChatReset: (request, call) => route(request.envId).call('ChatReset', request, as(call)),
    ChatStep: (request, call) => route(request.envId).call('ChatStep', request, as(call)),
    ChatRestore: (request, call) => route(request.envId).call('ChatRestore', request, as(call)),
    Close: (request, call) => route(request.envId).call('Close', request, as(call)),
  });
}
