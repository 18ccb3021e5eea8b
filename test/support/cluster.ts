import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import {
  startNode as startNodeIn,
  type HostInNamespace,
  type NodeProcess,
} from '../../examples/cluster/netns-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT } from './platform.ts';

import { createNamespace, removeNode } from '../../examples/cluster/netns-cluster.ts';

export { createNamespace, removeNode };
export type { HostInNamespace, NodeProcess } from '../../examples/cluster/netns-cluster.ts';

export const NODE_TOKEN = 'cluster-test-node-token-2b4d6f8a1c3e5079';

/** A node agent of the test cluster: its data below the test root, the shared test store. */
export function startNode(
  host: HostInNamespace,
  nodeId: string,
  port: number,
  args: string[] = [],
  firstStartEnv: Record<string, string> = {},
): Promise<NodeProcess> {
  return startNodeIn(host, nodeId, port, {
    dataDir: join(TEST_DATA_ROOT, `cluster-${nodeId}-${randomBytes(3).toString('hex')}`),
    storeDir: STORE_DIR,
    token: NODE_TOKEN,
    args,
    firstStartEnv,
  });
}

/** One node agent in a network namespace of its own, for a test file's `beforeAll`. */
export interface LoneNode {
  host: HostInNamespace;
  node: NodeProcess;
  /** Stops the node, removes its data and its namespace. */
  remove(): Promise<void>;
}

export async function startLoneNode(
  tag: string,
  subnet: number,
  port: number,
  args: string[],
): Promise<LoneNode> {
  const host = await createNamespace(tag, subnet);
  try {
    const node = await startNode(host, tag, port, args);
    return {
      host,
      node,
      async remove() {
        await removeNode(node).catch((error: unknown) => console.error(error));
        await host.remove();
      },
    };
  } catch (error) {
    await host.remove();
    throw error;
  }
}
