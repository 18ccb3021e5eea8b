import { reachHeldSandbox, type ReachedSandbox } from '../held-sandboxes.ts';
import { openCluster } from './cluster.ts';

/**
 * A live sandbox by id, from this process: on the cluster at $SANDGYM_PLATFORM through the
 * controller (which finds it only among the caller's project's sandboxes), else on this host
 * through the holder that `sandgym create` left owning it. Disposing it leaves the sandbox.
 */
export async function reachSandbox(id: string): Promise<ReachedSandbox> {
  const cluster = await openCluster();
  if (!cluster) return reachHeldSandbox(id);
  try {
    const sandbox = await cluster.attachSandbox(id);
    return { platform: cluster, sandbox, [Symbol.asyncDispose]: () => cluster.close() };
  } catch (error) {
    await cluster.close();
    throw error;
  }
}
