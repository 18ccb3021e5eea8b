import { randomBytes } from 'node:crypto';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { SandboxEnv, type StepSignals } from '../../src/env/index.ts';
import { Platform, type RemotePlatform, type Sandbox } from '../../src/platform/index.ts';
import {
  NODE_TOKEN,
  createNamespace,
  removeNode,
  startNode,
  type HostInNamespace,
  type NodeProcess,
} from '../support/cluster.ts';
import { createTestPlatform } from '../support/platform.ts';

/** What a create in a burst came to: a sandbox, or a refusal the caller can act on. */
type Outcome = { sandbox: Sandbox } | { refused: string; retryable: boolean };

function burst(platform: RemotePlatform, count: number): Promise<Outcome[]> {
  return Promise.all(startBurst(platform, count));
}

function startBurst(platform: RemotePlatform, count: number): Promise<Outcome>[] {
  return Array.from({ length: count }, () =>
    platform.createSandbox({ environment: 'busybox:latest', resources: { memoryMib: 64 } }).then(
      (sandbox): Outcome => ({ sandbox }),
      (error: unknown): Outcome => {
        if (!isSandgymError(error)) throw error; // anything untyped fails the test
        return { refused: error.code, retryable: error.retryable };
      },
    ),
  );
}

const served = (outcomes: Outcome[]): Sandbox[] =>
  outcomes.flatMap((o) => ('sandbox' in o ? [o.sandbox] : []));

describe('load and faults', () => {
  const tag = randomBytes(2).toString('hex');
  const hosts: HostInNamespace[] = [];
  const nodes: NodeProcess[] = [];
  const clients: RemotePlatform[] = [];

  afterAll(async () => {
    for (const client of clients) await client.close().catch(() => undefined);
    for (const node of nodes) await removeNode(node).catch((error: unknown) => console.error(error));
    for (const host of hosts) await host.remove();
  });

  async function nodeWith(
    index: number,
    args: string[],
  ): Promise<{ node: NodeProcess; client: RemotePlatform }> {
    const host = await createNamespace(`f${tag}${index}`, 220 + index);
    hosts.push(host);
    const node = await startNode(host, `f${index}${tag}`, 7400, args);
    nodes.push(node);
    const client = await Platform.connect(`grpc://${node.address}`, { token: NODE_TOKEN });
    clients.push(client);
    return { node, client };
  }

  it('serves or cleanly refuses every create of a burst beyond capacity', async () => {
    const { client } = await nodeWith(1, ['--max-sandboxes', '4', '--warm-pool', '0']);
    const outcomes = await burst(client, 16);
    const sandboxes = served(outcomes);
    try {
      expect(sandboxes.length).toBeGreaterThanOrEqual(1);
      expect(sandboxes.length).toBeLessThanOrEqual(4);
      for (const outcome of outcomes) {
        if ('refused' in outcome) expect(outcome).toEqual({ refused: 'admission_rejected', retryable: true });
      }
      for (const sandbox of sandboxes)
        expect((await sandbox.exec(['echo', 'served'])).stdout).toBe('served\n');
    } finally {
      await Promise.all(sandboxes.map((s) => s.close()));
    }
    // the room comes back
    const again = served(await burst(client, 4));
    expect(again).toHaveLength(4);
    await Promise.all(again.map((s) => s.close()));
  });

  it('recovers a node agent killed during a burst: its sandboxes adopted or reaped, new creates served', async () => {
    const { node, client } = await nodeWith(2, ['--warm-pool', '0']);
    const creates = startBurst(client, 64);
    // killed as soon as the first create is served: the rest of the burst is in flight
    await Promise.race(creates);
    node.child.kill('SIGKILL');
    const outcomes = await Promise.all(creates);
    const refused = outcomes.filter((o) => 'refused' in o);
    expect(refused.length, 'creates cut off by the kill').toBeGreaterThan(0);
    // a create cut off with its connection is refused as retryable, never left hanging
    for (const outcome of refused) {
      expect(outcome).toMatchObject({ retryable: true });
      expect(['node_lost', 'platform_error', 'unavailable']).toContain(
        (outcome as { refused: string }).refused,
      );
    }
    await node.restart();
    // every sandbox the node still lists answers; the rest of the burst left nothing behind
    const listed = await client.listSandboxes();
    for (const record of listed) {
      const sandbox = await client.attachSandbox(record.id);
      expect((await sandbox.exec(['echo', 'adopted'])).stdout).toBe('adopted\n');
      await sandbox.close();
    }
    await client.gc();
    const fresh = served(await burst(client, 3));
    expect(fresh).toHaveLength(3);
    await Promise.all(fresh.map((s) => s.close()));
    expect(await client.listSandboxes()).toEqual([]);
    const left = await readdir(join(node.dataDir, 'sandboxes')).catch(() => []);
    expect(left.filter((slot) => !slot.startsWith('warm-'))).toEqual([]);
  });

  it('gives a typed error, not corruption, when a sandbox fills its disk during steps', async () => {
    await using env = await createTestPlatform('faults-disk');
    await using gym = SandboxEnv.create(env.platform, {
      sandbox: { environment: 'busybox:latest', resources: { diskMib: 16 } },
    });
    await gym.reset();
    const fill = await gym.step({ type: 'exec', command: 'dd if=/dev/zero of=/root/fill bs=1M count=64' });
    expect(fill.observation).toMatchObject({ type: 'exec', exitCode: 1 });
    expect((fill.info.signals as StepSignals).limitsHit).toContain('disk');
    const write = await gym.step({
      type: 'write_file',
      path: '/root/notes.txt',
      content: 'x'.repeat(1 << 20),
    });
    expect(write.observation).toMatchObject({ type: 'error', code: 'resource_exhausted' });
    expect(JSON.stringify(write.observation)).toMatch(/disk is full.*resources\.diskMib/);
    await gym.step({ type: 'exec', command: 'rm /root/fill' });
    const retry = await gym.step({ type: 'write_file', path: '/root/notes.txt', content: 'kept' });
    expect(retry.observation).toMatchObject({ type: 'written' });
    const read = await gym.step({ type: 'read_file', path: '/root/notes.txt' });
    expect(read.observation).toMatchObject({ type: 'file', content: 'kept' });
    // the trajectory log (on the node's disk, not the sandbox's) holds every step, whole
    const records = await (await env.platform.stepLog(gym.current!.id)).records();
    expect(records.map((r) => r.stepIndex)).toEqual([0, 1, 2, 3, 4]);
  });

  it('caps a sandbox trajectory log: later records keep the head of long outputs, and the step says so', async () => {
    // whole records fill the first seven eighths of the cap: two of 30000 characters fit, not three
    await using env = await createTestPlatform('faults-log', { trajectoryCapBytes: 80 * 1024 });
    await using gym = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    await gym.reset();
    const loud = { type: 'exec' as const, command: 'head -c 30000 /dev/zero | tr "\\0" x' };
    const steps = [];
    for (let i = 0; i < 4; i++) steps.push(await gym.step(loud));
    const limits = steps.map((s) => (s.info.signals as StepSignals).limitsHit);
    expect(limits.slice(0, 2)).toEqual([[], []]);
    expect(limits.slice(2)).toEqual([['log'], ['log']]);
    // the caller got every output whole; the log kept the head of the capped ones
    for (const step of steps) expect(step.observation).toMatchObject({ stdout: 'x'.repeat(30000) });
    const records = await (await env.platform.stepLog(gym.current!.id)).records();
    const logged = records.map((r) => (r.result as { observation: { stdout: string } }).observation.stdout);
    expect(logged[1]).toHaveLength(30000);
    expect(logged[3]).toMatch(/^x{1024}….*the trajectory log reached its cap of 81920 bytes/);
  });
});
