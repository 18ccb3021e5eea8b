import { join } from 'node:path';
import { Etcd3 } from 'etcd3';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError, newSandboxId, silentLogger } from '../../src/common/index.ts';
import { NodeMembership, ProjectQuotaLedger, connectEtcd } from '../../src/platform/index.ts';
import { startEtcdCluster, type EtcdCluster } from '../../benchmarks/etcd-cluster.ts';
import { waitUntil } from '../../benchmarks/loopback.ts';
import { TEST_DATA_ROOT } from '../support/platform.ts';

/** A node's part of the quota: its membership (on a lease) and its ledger, on a connection of its own. */
interface Holder {
  nodeId: string;
  ledger: ProjectQuotaLedger;
  /** Sandboxes it admitted and has not destroyed. */
  live: Set<string>;
}

describe('quota blocks in etcd', () => {
  let etcd: EtcdCluster;
  let admin: Etcd3;
  const cleanup: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    etcd = await startEtcdCluster(join(TEST_DATA_ROOT, `etcd-blocks-${process.pid}`), 1);
    admin = new Etcd3({ hosts: etcd.endpoints });
  }, 60_000);
  afterAll(async () => {
    admin.close();
    await etcd[Symbol.asyncDispose]();
  });
  afterEach(async () => {
    for (const step of cleanup.reverse()) await step().catch((error: unknown) => console.error(error));
    cleanup.length = 0;
  });

  async function holder(nodeId: string): Promise<Holder> {
    const client = await connectEtcd({ endpoints: etcd.endpoints });
    cleanup.push(() => Promise.resolve(client.close()));
    const record = {
      nodeId,
      address: '127.0.0.1:1',
      backends: [],
      capacity: 1000,
      memoryCapacityMib: 1,
      draining: false,
    };
    const membership = await NodeMembership.join(client, record, 2, silentLogger());
    cleanup.push(() => membership.leave());
    return { nodeId, ledger: new ProjectQuotaLedger(client, membership, nodeId), live: new Set() };
  }

  /** Claims and settles one sandbox; false when the quota (or a lapsed lease) refused it. */
  async function admit(node: Holder, project: string, max: number): Promise<string | undefined> {
    try {
      const [claim] = await node.ledger.claim(project, 1, max);
      const id = newSandboxId(node.nodeId);
      node.live.add(id);
      // as a node agent does, a sandbox made stays made when etcd does not record it
      await node.ledger.settle(project, claim!, id).catch(() => undefined);
      return id;
    } catch (error) {
      if (isSandgymError(error, 'resource_exhausted', 'admission_rejected')) return undefined;
      throw error;
    }
  }

  async function destroy(node: Holder, project: string, id: string): Promise<void> {
    node.live.delete(id);
    await node.ledger.release(project, id);
  }

  const blocksSum = async (project: string): Promise<number> => {
    const kvs = (await admin.getAll().prefix(`/sandgym/quota/${project}/blocks/`).exec()).kvs;
    return kvs.reduce((sum, kv) => sum + (JSON.parse(kv.value.toString()) as { size: number }).size, 0);
  };

  it("never admits more than the quota across nodes under a concurrent burst, one node's lease lapsing mid-burst", async () => {
    const max = 30;
    const [a, b, c] = [await holder('qa'), await holder('qb'), await holder('qc')];
    let cLost = false;
    // what the cluster runs: a node whose lease lapsed is lost, with its sandboxes (node_lost)
    const live = (): number => a.live.size + b.live.size + (cLost ? 0 : c.live.size);
    let most = 0;
    let blocksMost = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        blocksMost = Math.max(blocksMost, await blocksSum('burst'));
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    })();
    let admitted = 0;
    const lapse = async (): Promise<void> => {
      const record = await admin.get('/sandgym/nodes/qc').exec();
      cLost = true;
      await admin.leaseClient.leaseRevoke({ ID: record.kvs[0]!.lease });
    };
    const nodes = [a, b, c];
    await Promise.all(
      Array.from({ length: 240 }, async (_, i) => {
        await new Promise((resolve) => setTimeout(resolve, (i % 40) * 5));
        const node = nodes[i % 3]!;
        const id = await admit(node, 'burst', max);
        if (id === undefined) return;
        most = Math.max(most, live());
        if (++admitted === 20) await lapse();
        // a third of them end soon, so blocks shrink and grow through the burst
        if (i % 3 === 0) {
          await new Promise((resolve) => setTimeout(resolve, 20));
          await destroy(node, 'burst', id);
        }
      }),
    );
    sampling = false;
    await sampler;
    expect(cLost).toBe(true);
    expect(most).toBeLessThanOrEqual(max);
    expect(blocksMost).toBeLessThanOrEqual(max);
    // the lapsed node's slots came back to the pool, but for what it grew again after rejoining
    // (room for every sandbox it still ran): the others fill the rest exactly
    await waitUntil(async () => (await admin.get('/sandgym/nodes/qc').string()) !== null, 'qc rejoining');
    while ((await admit(a, 'burst', max)) !== undefined) expect(live()).toBeLessThanOrEqual(max);
    const regrown = await admin.get('/sandgym/quota/burst/blocks/qc').string();
    const cBlock = regrown === null ? 0 : (JSON.parse(regrown) as { size: number }).size;
    expect(a.live.size + b.live.size + cBlock).toBe(max);
  }, 60_000);

  it('moves the guard key far less than once per create while the quota has room', async () => {
    const [a, b] = [await holder('ga'), await holder('gb')];
    const made = await Promise.all(
      Array.from({ length: 200 }, (_, i) => admit(i % 2 ? a : b, 'roomy', 10_000)),
    );
    expect(made.every((id) => id !== undefined)).toBe(true);
    const guard = await admin.get('/sandgym/quota/roomy/guard').exec();
    // one guard write per claim before blocks; now one per block grown
    expect(Number(guard.kvs[0]!.version)).toBeLessThan(20);
    expect(await admin.getAll().prefix('/sandgym/quota/roomy/held/').count()).toBe(200);
  });

  it('writes etcd nothing for a create or destroy within its block but the sandbox key', async () => {
    const [a] = [await holder('wa')];
    // the first create grows the block, with spare for those that follow
    expect(await admit(a, 'churn', 10_000)).toBeDefined();
    const revision = async (): Promise<bigint> =>
      BigInt((await admin.get('/sandgym/quota/churn/guard').exec()).header.revision);
    const before = await revision();
    for (let i = 0; i < 40; i++) {
      const id = await admit(a, 'churn', 10_000);
      expect(id).toBeDefined();
      await destroy(a, 'churn', id!);
    }
    // one write to make each held key and one to delete it: no grow, no block written
    expect(await revision()).toBe(before + 80n);
  });

  it('returns spare another node wants though the node holding it keeps creating', async () => {
    const [a, b] = [await holder('ka'), await holder('kb')];
    const max = 40;
    expect(await admit(a, 'wanted', max)).toBeDefined();
    expect(await blocksSum('wanted')).toBeGreaterThan(1);
    // a stays busy, one sandbox at a time, so its block is never idle
    let busy = true;
    const churning = (async () => {
      while (busy) {
        const id = await admit(a, 'wanted', max);
        if (id !== undefined) await destroy(a, 'wanted', id);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    try {
      // a holds its first sandbox and at most one more: b gets every other slot
      while ((await admit(b, 'wanted', max)) !== undefined) expect(b.live.size).toBeLessThan(max);
      expect(b.live.size).toBeGreaterThanOrEqual(max - 2);
    } finally {
      busy = false;
      await churning;
    }
  });

  it("spreads a node's held keys over leases of at most a thousand, which go when it leaves", async () => {
    const a = await holder('la');
    const ids = Array.from({ length: 2500 }, () => newSandboxId(a.nodeId));
    // adopted sandboxes, as after a restart: counted in one go
    await a.ledger.hold('spread', ...ids);
    const perLease = new Map<string, number>();
    for (const kv of (await admin.getAll().prefix('/sandgym/quota/spread/held/').exec()).kvs)
      perLease.set(kv.lease, (perLease.get(kv.lease) ?? 0) + 1);
    expect([...perLease.values()].reduce((sum, n) => sum + n, 0)).toBe(2500);
    // etcd 3.4 applies a put on a lease in time linear in its keys: none carries them all
    expect(Math.max(...perLease.values())).toBeLessThanOrEqual(1000);
    await cleanup.pop()!();
    expect(await admin.getAll().prefix('/sandgym/quota/spread/held/').count()).toBe(0);
  });

  it("returns an idle block's spare, so another node short of slots gets it", async () => {
    const [a, b] = [await holder('ra'), await holder('rb')];
    const max = 100;
    // a's first grow takes a spare beyond the one slot it needs
    expect(await admit(a, 'spare', max)).toBeDefined();
    expect(await blocksSum('spare')).toBeGreaterThan(1);
    for (let i = 0; i < max - 1; i++) expect(await admit(b, 'spare', max)).toBeDefined();
    expect(await admit(b, 'spare', max)).toBeUndefined();
    expect(await blocksSum('spare')).toBe(max);
  });
});
