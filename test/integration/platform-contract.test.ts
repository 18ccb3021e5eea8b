import { silentLogger } from '../../src/common/index.ts';
import {
  Controller,
  NodeAgent,
  Platform,
  type ConnectOptions,
  type PlatformClient,
} from '../../src/platform/index.ts';
import { describePlatformContract } from '../conformance/platform-contract.ts';
import { createTestPlatform } from '../support/platform.ts';

const NODE_TOKEN = 'node-secret-5d7f9b1e3a2c4068a9c1e3f5';
const GRANTS = {
  'token-a': { project: 'alpha', maxSandboxes: 50 },
  'token-b': { project: 'beta', maxSandboxes: 50 },
};

describePlatformContract({
  name: 'local',
  async open() {
    const test = await createTestPlatform('contract-local', { privateStore: true });
    return { platform: test.platform, dispose: async () => test[Symbol.asyncDispose]() };
  },
});

/** A node agent over a fresh test platform; stopping it also disposes the platform. */
async function startNode(name: string): Promise<{ node: NodeAgent; stop: () => Promise<void> }> {
  const test = await createTestPlatform(name, { privateStore: true });
  const node = await NodeAgent.start(test.platform, {
    listen: '127.0.0.1:0',
    token: NODE_TOKEN,
    logger: silentLogger(),
  });
  return {
    node,
    stop: async () => {
      try {
        await node.close();
      } finally {
        await test[Symbol.asyncDispose]();
      }
    },
  };
}

/** A client and another project's client at `url`; disposing them also runs `teardown`. */
async function remoteClients(
  url: string,
  mine: ConnectOptions,
  theirs: ConnectOptions,
  teardown: () => Promise<void>,
): Promise<{ platform: PlatformClient; otherProject: PlatformClient; dispose(): Promise<void> }> {
  const platform = await Platform.connect(url, mine);
  const otherProject = await Platform.connect(url, theirs);
  return {
    platform,
    otherProject,
    async dispose() {
      try {
        await platform.close();
        await otherProject.close();
      } finally {
        await teardown();
      }
    },
  };
}

describePlatformContract({
  name: 'remote, straight to a node agent',
  async open() {
    const { node, stop } = await startNode('contract-node');
    return remoteClients(
      `grpc://127.0.0.1:${node.port}`,
      { token: NODE_TOKEN },
      { token: NODE_TOKEN, metadata: { 'sandgym-project': 'other' } },
      stop,
    );
  },
});

describePlatformContract({
  name: 'remote, through a controller',
  async open() {
    const { node, stop } = await startNode('contract-ctl');
    const controller = await Controller.start({
      listen: '127.0.0.1:0',
      nodes: [`127.0.0.1:${node.port}`],
      nodeToken: NODE_TOKEN,
      grants: GRANTS,
      logger: silentLogger(),
      pollMs: 200,
    });
    return remoteClients(
      `grpc://127.0.0.1:${controller.port}`,
      { token: 'token-a' },
      { token: 'token-b' },
      async () => {
        try {
          await controller.close();
        } finally {
          await stop();
        }
      },
    );
  },
});
