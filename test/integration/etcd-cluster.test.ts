import { spawnSync } from 'node:child_process';
import { rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { Etcd3 } from 'etcd3';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError, nodeOfSandboxId, silentLogger } from '../../src/common/index.ts';
import type { NodeAgent } from '../../src/platform/index.ts';
import {
  Controller,
  Platform,
  readTlsFiles,
  type PlatformClient,
  type Sandbox,
} from '../../src/platform/index.ts';
import { startEtcdCluster, type EtcdCluster } from '../../benchmarks/etcd-cluster.ts';
import { expectCode } from '../support/errors.ts';
import { startTestNode } from '../support/in-process-cluster.ts';
import { TEST_DATA_ROOT } from '../support/platform.ts';
import { waitUntil } from '../../benchmarks/loopback.ts';

const NODE_TOKEN = 'etcd-test-node-token-8c1e5a7f3b9d2046';
const SMALL = { environment: 'busybox:latest', resources: { memoryMib: 32 } };
const GRANTS = {
  'token-a': { project: 'a', maxSandboxes: 40 },
  'token-q': { project: 'q', maxSandboxes: 6 },
};

describe('a cluster on a real three-member etcd', () => {
  let etcd: EtcdCluster;
  const cleanup: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    etcd = await startEtcdCluster(join(TEST_DATA_ROOT, `etcd-${process.pid}`), 3);
  }, 60_000);
  afterAll(async () => etcd[Symbol.asyncDispose]());
  afterEach(async () => {
    for (const step of cleanup.reverse()) await step().catch((error: unknown) => console.error(error));
    cleanup.length = 0;
  });

  function node(name: string, endpoints: string[], maxSandboxes = 20): Promise<NodeAgent> {
    return startTestNode(cleanup, name, {
      token: NODE_TOKEN,
      maxSandboxes,
      etcd: { endpoints, leaseTtlSeconds: 2 },
    });
  }

  async function controller(): Promise<Controller> {
    const started = await Controller.start({
      listen: '127.0.0.1:0',
      etcd: { endpoints: etcd.endpoints.slice(0, 2) },
      nodeToken: NODE_TOKEN,
      grants: GRANTS,
      logger: silentLogger(),
      pollMs: 200,
      queueTimeoutMs: 5_000,
    });
    cleanup.push(() => started.close());
    return started;
  }

  async function connect(replica: Controller, token: string): Promise<PlatformClient> {
    const client = await Platform.connect(`grpc://127.0.0.1:${replica.port}`, { token });
    cleanup.push(() => client.close());
    return client;
  }

  it("drops a node from placement when its lease lapses, and says its sandboxes' node is lost", async () => {
    // the first node reaches etcd only through the third member; killing that member cuts it off
    // while the other two keep quorum, so its lease lapses for real
    const doomed = await node('lapsea', [etcd.members[2]!.endpoint]);
    await node('lapseb', etcd.endpoints.slice(0, 2));
    const replica = await controller();
    const client = await connect(replica, 'token-a');
    const before: Sandbox[] = [];
    for (let i = 0; i < 6; i++) before.push(await client.createSandbox(SMALL));
    const onDoomed = before.find((sandbox) => nodeOfSandboxId(sandbox.id) === 'lapsea');
    expect(onDoomed, 'placement used both nodes').toBeDefined();

    await etcd.members[2]!.kill();
    await waitUntil(
      () =>
        onDoomed!.exec(['true']).then(
          () => false,
          (error: unknown) => isSandgymError(error, 'node_lost'),
        ),
      'the lapsed node leaving placement',
      20_000,
    );
    for (let i = 0; i < 6; i++)
      expect(nodeOfSandboxId((await client.createSandbox(SMALL)).id)).toBe('lapseb');
    expect(doomed.status().sandboxes).toBeGreaterThan(0); // its sandboxes still run; the node is unreachable to the cluster
  });

  it('serves at once from a controller replica added in the middle of a burst', async () => {
    await node('bursta', etcd.endpoints);
    await node('burstb', etcd.endpoints);
    const first = await connect(await controller(), 'token-a');
    const burst = Array.from({ length: 12 }, () => first.createSandbox(SMALL));
    const added = await controller();
    const second = await connect(added, 'token-a');
    const fromAdded = await Promise.all(Array.from({ length: 4 }, () => second.createSandbox(SMALL)));
    const all = [...(await Promise.all(burst)), ...fromAdded];
    expect(new Set(all.map((sandbox) => sandbox.id)).size).toBe(16);
    expect(new Set(fromAdded.map((sandbox) => nodeOfSandboxId(sandbox.id)))).not.toContain('local');
    expect((await second.listSandboxes()).length).toBe(16);
  });

  it('keeps run leases in etcd: a late node joins the run, a lapse and a renewal reach every node', async () => {
    await node('runa', etcd.endpoints, 1);
    await node('runb', etcd.endpoints, 1);
    const replicas = [await controller(), await controller()];
    const [viaFirst, viaSecond] = [
      await connect(replicas[0]!, 'token-a'),
      await connect(replicas[1]!, 'token-a'),
    ];
    const run = await viaFirst.startRun({ name: 'shared', leaseMs: 2_000 });
    const members = [
      await viaFirst.createSandbox({ ...SMALL, run: 'shared' }),
      await viaSecond.createSandbox({ ...SMALL, run: 'shared' }),
    ];
    // a node that joins after the run started learns it from etcd: the third member lands there
    await node('runc', etcd.endpoints, 1);
    await waitUntil(
      async () =>
        (await viaSecond.createSandbox({ ...SMALL, run: 'shared' }).then((s) => members.push(s))) > 0,
      'a create on the late node',
      10_000,
    );
    expect(new Set(members.map((m) => nodeOfSandboxId(m.id)))).toEqual(new Set(['runa', 'runb', 'runc']));

    // renewals through the other replica keep the lease; then the trainer stops renewing
    const second = await viaSecond.startRun({ name: 'shared', leaseMs: 2_000 });
    for (let i = 0; i < 3; i++) {
      await new Promise((resolve) => setTimeout(resolve, 800));
      expect((await second.renew()).lapsed).toBe(false);
    }
    const state = async (id: string) => (await viaFirst.attachSandbox(id)).state;
    await waitUntil(
      async () => (await Promise.all(members.map((m) => state(m.id)))).every((s) => s === 'hibernated'),
      'every member hibernating after the lease lapsed in etcd',
      20_000,
    );
    // a renewal through either replica brings them all back
    await run.renew();
    for (const member of members) expect((await member.exec(['echo', 'back'])).stdout).toBe('back\n');
    expect((await run.end()).destroyed.sort()).toEqual(members.map((m) => m.id).sort());
    await expectCode(second.renew(), 'not_found', /No run/);
  });

  it('rejoins when its lease is lost, and counts its sandboxes against the quota again', async () => {
    await node('rejoin', etcd.endpoints);
    const client = await connect(await controller(), 'token-q');
    const kept = [await client.createSandbox(SMALL), await client.createSandbox(SMALL)];
    const admin = new Etcd3({ hosts: etcd.endpoints });
    cleanup.push(() => Promise.resolve(admin.close()));
    const held = () => admin.getAll().prefix('/sandgym/quota/q/held/').count();
    const record = await admin.get('/sandgym/nodes/rejoin').exec();
    expect(await held()).toBe(2);
    // etcd forgets the node's lease, as after a partition longer than its TTL
    await admin.leaseClient.leaseRevoke({ ID: record.kvs[0]!.lease });
    await waitUntil(
      async () => (await admin.get('/sandgym/nodes/rejoin').string()) !== null && (await held()) === 2,
      'the node rejoining with its quota keys',
      15_000,
    );
    const more = await Promise.allSettled(Array.from({ length: 6 }, () => client.createSandbox(SMALL)));
    expect(more.filter((o) => o.status === 'fulfilled')).toHaveLength(4);
    for (const sandbox of kept)
      expect((await sandbox.exec(['echo', 'still here'])).stdout).toBe('still here\n');
  });

  it("admits exactly a project's quota across two replicas under a concurrent burst", async () => {
    await node('quotaa', etcd.endpoints);
    await node('quotab', etcd.endpoints);
    const replicas = [await controller(), await controller()];
    const clients = [await connect(replicas[0]!, 'token-q'), await connect(replicas[1]!, 'token-q')];
    const outcomes = await Promise.allSettled(
      Array.from({ length: 16 }, (_, i) => clients[i % 2]!.createSandbox(SMALL)),
    );
    const made = outcomes.flatMap((o) => (o.status === 'fulfilled' ? [o.value] : []));
    const refused = outcomes.flatMap((o) => (o.status === 'rejected' ? [o.reason as unknown] : []));
    expect(made).toHaveLength(6);
    for (const error of refused)
      expect(isSandgymError(error, 'resource_exhausted') && /quota/.test(String(error))).toBe(true);

    // freeing two lets exactly two more in, through either replica
    await made[0]!.close();
    await made[1]!.close();
    const again = await Promise.allSettled(
      Array.from({ length: 4 }, (_, i) => clients[i % 2]!.createSandbox(SMALL)),
    );
    expect(again.filter((o) => o.status === 'fulfilled')).toHaveLength(2);
    await expectCode(clients[0]!.createSandbox(SMALL), 'resource_exhausted', /6 of its 6/);
  });

  it('speaks mutual TLS to an https etcd, and cannot join it without a certificate of its CA', async () => {
    const dir = join(TEST_DATA_ROOT, `etcd-tls-${process.pid}`);
    const made = spawnSync(
      'node',
      [resolve('dist/src/cli/main.js'), 'certs', '--out', join(dir, 'certs'), '--json'],
      {
        encoding: 'utf8',
      },
    );
    expect(made.status, made.stderr).toBe(0);
    const files = JSON.parse(made.stdout) as Record<'ca' | 'server' | 'serverKey', string>;
    cleanup.push(() => rm(dir, { recursive: true, force: true }));
    const secure = await startEtcdCluster(join(dir, 'etcd'), 1, {
      ca: files.ca,
      cert: files.server,
      key: files.serverKey,
    });
    cleanup.push(async () => secure[Symbol.asyncDispose]());
    const tls = await readTlsFiles({ ca: files.ca, cert: files.server, key: files.serverKey });
    await startTestNode(cleanup, 'tlsnode', {
      token: NODE_TOKEN,
      etcd: { endpoints: secure.endpoints, tls },
    });
    const replica = await Controller.start({
      listen: '127.0.0.1:0',
      etcd: { endpoints: secure.endpoints, tls },
      nodeToken: NODE_TOKEN,
      grants: GRANTS,
      logger: silentLogger(),
      pollMs: 200,
    });
    cleanup.push(() => replica.close());
    const client = await connect(replica, 'token-a');
    expect(nodeOfSandboxId((await client.createSandbox(SMALL)).id)).toBe('tlsnode');

    // without a client certificate the controller cannot reach that etcd, and says where it failed
    await expect(
      Controller.start({
        listen: '127.0.0.1:0',
        etcd: { endpoints: secure.endpoints, tls: { ca: tls.ca } },
        nodeToken: NODE_TOKEN,
        grants: GRANTS,
        logger: silentLogger(),
      }),
    ).rejects.toThrow(/etcd at https:\/\/127\.0\.0\.1:\d+ does not answer/);
  });
});
