import { join } from 'node:path';
import { silentLogger } from '../../src/common/index.ts';
import { envService } from '../../src/env/index.ts';
import {
  Controller,
  NodeAgent,
  Platform,
  type ControllerOptions,
  type LocalPlatform,
  type LocalPlatformOptions,
  type NodeAgentOptions,
  type ProjectGrant,
} from '../../src/platform/index.ts';
import { createTestPlatform } from './platform.ts';

/** The node token of in-process test clusters: long and random enough for a node to accept it. */
export const IN_PROCESS_NODE_TOKEN = 'in-process-node-token-6e8a0c2f4b1d3957';

/** One node agent and one controller in this process, on loopback ports of their own. */
export interface InProcessCluster {
  nodePlatform: LocalPlatform;
  node: NodeAgent;
  controller: Controller;
  /** `grpc://127.0.0.1:PORT` of the controller. */
  url: string;
  /** Stops the controller and the node (whose platform then destroys its sandboxes). */
  close(): Promise<void>;
}

/** Starts a node on `dataDir` (data in `node/` below it) and `storeDir`, behind a controller granting `grants`. */
export async function startInProcessCluster(options: {
  dataDir: string;
  storeDir: string;
  nodeId: string;
  grants: Record<string, ProjectGrant>;
  /** Serve the Envs service too, with task envs from this folder. */
  envs?: { taskRoot: string };
  /** More options of the node's platform (its rule book, its control plane, its store), its agent and the controller. */
  platform?: Pick<
    LocalPlatformOptions,
    'networkRules' | 'controlPlane' | 'freshLayerHoldMs' | 'maxStoreBytes'
  >;
  node?: Partial<NodeAgentOptions>;
  controller?: Partial<ControllerOptions>;
}): Promise<InProcessCluster> {
  const nodePlatform = await Platform.local({
    dataDir: join(options.dataDir, 'node'),
    storeDir: options.storeDir,
    nodeId: options.nodeId,
    durable: true,
    ...options.platform,
  });
  const node = await NodeAgent.start(nodePlatform, {
    listen: '127.0.0.1:0',
    token: IN_PROCESS_NODE_TOKEN,
    logger: silentLogger(),
    ...options.node,
    ...(options.envs
      ? {
          services: (agent: NodeAgent) => [
            envService((project, limits) => agent.clientFor(project, limits), {
              nodeId: options.nodeId,
              taskRoot: options.envs!.taskRoot,
            }),
          ],
        }
      : {}),
  });
  const controller = await Controller.start({
    listen: '127.0.0.1:0',
    nodes: [`127.0.0.1:${node.port}`],
    nodeToken: IN_PROCESS_NODE_TOKEN,
    grants: options.grants,
    logger: silentLogger(),
    pollMs: 200,
    ...options.controller,
  });
  return {
    nodePlatform,
    node,
    controller,
    url: `grpc://127.0.0.1:${controller.port}`,
    async close() {
      try {
        await controller.close();
      } finally {
        await node.close();
      }
    },
  };
}

/**
 * A node agent on a fresh test platform whose sandbox ids carry `name`, listening on a loopback
 * port of its own; its close and the platform's disposal are pushed onto `cleanup`.
 */
export async function startTestNode(
  cleanup: (() => Promise<unknown>)[],
  name: string,
  options: Partial<NodeAgentOptions> & { token: string },
): Promise<NodeAgent> {
  const test = await createTestPlatform(`node-${name}`, { nodeId: name });
  cleanup.push(async () => test[Symbol.asyncDispose]());
  const agent = await NodeAgent.start(test.platform, {
    listen: '127.0.0.1:0',
    logger: silentLogger(),
    ...options,
  });
  cleanup.push(() => agent.close());
  return agent;
}
