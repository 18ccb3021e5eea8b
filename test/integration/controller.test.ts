import { afterEach, describe, expect, it } from 'vitest';
import { nodeOfSandboxId, silentLogger } from '../../src/common/index.ts';
import type { NodeAgent } from '../../src/platform/index.ts';
import {
  Controller,
  Platform,
  type ControllerOptions,
  type PlatformClient,
  type Sandbox,
} from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import { startTestNode } from '../support/in-process-cluster.ts';

const NODE_TOKEN = 'controller-test-node-token-3f9a1c7e5b2d4086';
const SMALL = { environment: 'busybox:latest', resources: { memoryMib: 64 } };

describe('controller admission', () => {
  const cleanup: (() => Promise<unknown>)[] = [];

  afterEach(async () => {
    for (const step of cleanup.reverse()) await step().catch((error: unknown) => console.error(error));
    cleanup.length = 0;
  });

  function node(name: string, maxSandboxes: number, memoryCapacityMib = 4096): Promise<NodeAgent> {
    return startTestNode(cleanup, name, { token: NODE_TOKEN, maxSandboxes, memoryCapacityMib });
  }

  async function controller(
    nodes: NodeAgent[],
    options: Partial<ControllerOptions> = {},
  ): Promise<(token: string) => Promise<PlatformClient>> {
    const started = await Controller.start({
      listen: '127.0.0.1:0',
      nodes: nodes.map((n) => `127.0.0.1:${n.port}`),
      nodeToken: NODE_TOKEN,
      grants: {
        'token-a': { project: 'a', maxSandboxes: 10 },
        'token-b': { project: 'b', maxSandboxes: 10 },
        'token-tiny': { project: 'tiny', maxSandboxes: 1 },
      },
      logger: silentLogger(),
      pollMs: 100,
      ...options,
    });
    cleanup.push(() => started.close());
    return async (token) => {
      const client = await Platform.connect(`grpc://127.0.0.1:${started.port}`, { token });
      cleanup.push(() => client.close());
      return client;
    };
  }

  it('queues a burst beyond capacity and serves it as room frees, never over capacity', async () => {
    const connect = await controller([await node('burst', 2)]);
    const client = await connect('token-a');
    const made: Sandbox[] = [];
    const burst = Array.from({ length: 4 }, () =>
      client.createSandbox(SMALL).then((sandbox) => {
        made.push(sandbox);
        return sandbox;
      }),
    );
    while (made.length < 2) await new Promise((resolve) => setTimeout(resolve, 50));
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(made).toHaveLength(2); // the rest wait for room
    for (const sandbox of made.slice(0, 2)) await sandbox.close();
    const all = await Promise.all(burst);
    expect(new Set(all.map((s) => s.id)).size).toBe(4);
    expect((await client.listSandboxes()).length).toBe(2);
  });

  it('fails a queued create at its deadline, and at once when no node could ever hold it', async () => {
    const connect = await controller([await node('full', 1, 512)], { queueTimeoutMs: 300 });
    const client = await connect('token-a');
    await client.createSandbox(SMALL);
    await expectCode(client.createSandbox(SMALL), 'resource_exhausted', /deadline/);
    await expectCode(
      client.createSandbox({ ...SMALL, resources: { memoryMib: 1024 } }),
      'admission_rejected',
      /can ever hold|ask for less memory/,
    );
  });

  it("enforces a project's quota, whoever else has room", async () => {
    const connect = await controller([await node('quota', 10)]);
    const tiny = await connect('token-tiny');
    await tiny.createSandbox(SMALL);
    await expectCode(tiny.createSandbox(SMALL), 'resource_exhausted', /quota/);
    const other = await connect('token-b');
    await other.createSandbox(SMALL);
  });

  it('places elsewhere when a node vetoes what its stale view allowed', async () => {
    const first = await node('veto', 1);
    const second = await node('other', 1);
    const connect = await controller([first, second], { pollMs: 60_000 });
    // fill the first node behind the controller's back: its view still says empty
    const direct = await Platform.connect(`grpc://127.0.0.1:${first.port}`, { token: NODE_TOKEN });
    cleanup.push(() => direct.close());
    await direct.createSandbox(SMALL);
    const client = await connect('token-a');
    const placed = await client.createSandbox(SMALL);
    expect(nodeOfSandboxId(placed.id)).toBe('other');
  });
});
