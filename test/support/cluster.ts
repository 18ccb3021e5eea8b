import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import {
  startNode as startNodeIn,
  type HostInNamespace,
  type NodeProcess,
} from '../../examples/cluster/netns-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT } from './platform.ts';

export { createNamespace, removeNode } from '../../examples/cluster/netns-cluster.ts';
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
