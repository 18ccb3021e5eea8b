import { join } from 'node:path';
import { Etcd3 } from 'etcd3';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError, nodeOfSandboxId, silentLogger } from '../../src/common/index.ts';
import { BACKEND_NAMES } from '../../src/backends/index.ts';
import { Controller, Platform, connectEtcd, type PlatformClient } from '../../src/platform/index.ts';
import { startEtcdCluster, type EtcdCluster } from '../../benchmarks/etcd-cluster.ts';
import { SimulatedNode, type SimulatorOptions } from '../../benchmarks/node-simulator.ts';
import { TEST_DATA_ROOT } from '../support/platform.ts';
import { waitUntil } from '../../benchmarks/loopback.ts';

const NODE_TOKEN = 'simulator-test-node-token-5d2e8b1c7a40f396';
const GRANTS = { 'token-sim-a': { project: 'sa', maxSandboxes: 5 } };

describe('the node simulator (benchmarks only)', () => {
  let etcd: EtcdCluster;
  const cleanup: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    etcd = await startEtcdCluster(join(TEST_DATA_ROOT, `etcd-sim-${process.pid}`), 1);
  }, 60_000);
  afterAll(async () => etcd[Symbol.asyncDispose]());
  afterEach(async () => {
    for (const step of cleanup.reverse()) await step().catch((error: unknown) => console.error(error));
    cleanup.length = 0;
  });

  async function simulated(ids: string[], options: Partial<SimulatorOptions> = {}): Promise<SimulatedNode[]> {
    const client = await connectEtcd({ endpoints: etcd.endpoints });
    cleanup.push(() => Promise.resolve(client.close()));
    const settings: SimulatorOptions = {
      token: NODE_TOKEN,
      capacity: 100,
      createLatencyMs: 5,
      quotasOff: false,
      leaseTtlSeconds: 5,
      logger: silentLogger(),
      ...options,
    };
    const nodes: SimulatedNode[] = [];
    for (const id of ids) {
      const node = await SimulatedNode.start(client, id, settings);
      cleanup.push(() => node.close());
      nodes.push(node);
    }
    return nodes;
  }

  async function through(replicas = 1): Promise<PlatformClient[]> {
    const clients: PlatformClient[] = [];
    for (let i = 0; i < replicas; i++) {
      const controller = await Controller.start({
        listen: '127.0.0.1:0',
        etcd: { endpoints: etcd.endpoints },
        nodeToken: NODE_TOKEN,
        grants: GRANTS,
        logger: silentLogger(),
        pollMs: 100,
        queueTimeoutMs: 3_000,
      });
      cleanup.push(() => controller.close());
      const client = await Platform.connect(`grpc://127.0.0.1:${controller.port}`, { token: 'token-sim-a' });
      cleanup.push(() => client.close());
      clients.push(client);
    }
    return clients;
  }

  it('is no backend a user can select', () => {
    expect(BACKEND_NAMES as readonly string[]).not.toContain('simulated');
    expect((BACKEND_NAMES as readonly string[]).some((name) => /sim/.test(name))).toBe(false);
  });

  it("registers in etcd, and makes records through controllers within the project's quota in etcd", async () => {
    const nodes = await simulated(['sima', 'simb']);
    const admin = new Etcd3({ hosts: etcd.endpoints });
    cleanup.push(() => Promise.resolve(admin.close()));
    expect((await admin.getAll().prefix('/sandgym/nodes/sim').keys()).sort()).toEqual([
      '/sandgym/nodes/sima',
      '/sandgym/nodes/simb',
    ]);
    const [a, b] = await through(2);
    const outcomes = await Promise.allSettled(
      Array.from({ length: 9 }, (_, i) => (i % 2 ? a! : b!).createSandbox({ resources: { memoryMib: 32 } })),
    );
    const made = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
    expect(made).toHaveLength(5);
    for (const o of outcomes)
      if (o.status === 'rejected') expect(isSandgymError(o.reason, 'resource_exhausted')).toBe(true);
    const held = () => admin.getAll().prefix('/sandgym/quota/sa/held/').count();
    expect(await held()).toBe(5);
    expect(nodes.reduce((sum, node) => sum + node.live, 0)).toBe(5);
    expect(new Set(made.map((sandbox) => nodeOfSandboxId(sandbox.id))).size).toBeGreaterThan(0);
    expect(nodes[0]!.quota.profile.conflicts + nodes[1]!.quota.profile.conflicts).toBeGreaterThanOrEqual(0);

    // Destroy goes through the node's real wire and frees the quota in etcd
    await made[0]!.close();
    expect(await held()).toBe(4);
    await a!.createSandbox({ resources: { memoryMib: 32 } });
    expect(await held()).toBe(5);

    // a simulated node's Status is what controllers poll
    await waitUntil(
      () => Promise.resolve(nodes.reduce((sum, node) => sum + (node.status().projects['sa'] ?? 0), 0) === 5),
      'statuses counting the records',
    );
    for (const sandbox of made.slice(1)) await sandbox.close();
  });

  it('refuses what it does not simulate, naming the methods it serves', async () => {
    await simulated(['simc']);
    const [client] = await through();
    const sandbox = await client!.createSandbox({ resources: { memoryMib: 32 } });
    await expect(sandbox.exec(['true'])).rejects.toThrow(/Create, Destroy, Describe and Status/);
    await sandbox.close();
  });

  it('writes plain held keys and no guard with quotas off', async () => {
    await simulated(['simd'], { quotasOff: true });
    const admin = new Etcd3({ hosts: etcd.endpoints });
    cleanup.push(() => Promise.resolve(admin.close()));
    const [client] = await through();
    const before = await admin.get('/sandgym/quota/sa/guard').exec();
    const sandbox = await client!.createSandbox({ resources: { memoryMib: 32 } });
    const after = await admin.get('/sandgym/quota/sa/guard').exec();
    expect(after.kvs[0]?.mod_revision).toBe(before.kvs[0]?.mod_revision);
    expect(await admin.getAll().prefix('/sandgym/quota/sa/held/').count()).toBe(1);
    await sandbox.close();
  });
});
