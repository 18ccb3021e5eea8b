import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { addressOf, flowsOf } from '../support/node-network.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';
import { attack } from './summary.ts';

/** What a GET of the upstream's /id on `port` printed (busybox wget), or `refused`. */
async function fetchId(sandbox: Sandbox, address: string, port: number): Promise<string> {
  const result = await sandbox.exec(
    ['sh', '-c', `timeout 5 wget -q -O - http://${address}:${port}/id 2>/dev/null || echo refused`],
    { timeoutMs: 10_000 },
  );
  return result.stdout.trim();
}

/**
 * A pooled container keeps its veth on the node network for its next tenant (setting one up
 * costs more than the rest of a create). Who controls it: each tenant, one after another, with
 * root in its sandbox but no CAP_NET_ADMIN. What a tenant must never get: the rules of the tenant
 * before it, its flows (a reply or a stream still on the address), its record of refused
 * destinations or its count of them, or a veth when its own rules allow nothing beyond loopback.
 */
describe("a pooled container's network, kept for its next tenant", () => {
  let env: TestPlatform;
  let upstream: Upstream;

  beforeAll(async () => {
    upstream = await startUpstream(11, [8080, 8081]);
    env = await createTestPlatform('pooled-network', {
      warmPool: { latency: 1 },
      networkRules: {
        'mirror:first': [`${upstream.address}:8080`],
        'mirror:second': [`${upstream.address}:8081`],
      },
    });
    await env.platform.warmPool.filled(60_000);
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
    await upstream?.[Symbol.asyncDispose]();
  });

  /** A tenant on the one pooled shell: the last one's container, scrubbed. */
  async function nextTenant(network: string[]): Promise<Sandbox> {
    await env.platform.warmPool.recycled();
    return env.platform.createSandbox({ environment: 'busybox:latest', network });
  }

  it("gives each tenant its own rules, record and count, and none of the last one's flows", () =>
    attack('pooled-network', "inherit the last tenant's network", async () => {
      const first = await nextTenant(['mirror:first']);
      let address: string;
      try {
        address = await addressOf(first);
        expect(address).not.toBe('');
        expect(await fetchId(first, upstream.address, 8080)).toBe('port 8080');
        expect(await fetchId(first, upstream.address, 8081)).toBe('refused');
        const stats = await first.stats();
        expect(stats.deniedEgress).toBeGreaterThanOrEqual(1);
        expect(stats.network?.denied).toContain(`${upstream.address}:8081/tcp`);
        expect(flowsOf(address)).not.toBe(''); // its fetch left flows on the address
      } finally {
        await first.close();
      }
      await env.platform.warmPool.recycled();
      expect(flowsOf(address)).toBe('');

      // other rules: the first tenant's target is closed to it, its own is open
      const second = await nextTenant(['mirror:second']);
      try {
        expect(await addressOf(second)).toBe(address); // the very same veth
        const fresh = await second.stats();
        expect(fresh.deniedEgress).toBe(0);
        expect(fresh.network?.denied ?? []).toEqual([]);
        expect(await fetchId(second, upstream.address, 8080)).toBe('refused');
        expect(await fetchId(second, upstream.address, 8081)).toBe('port 8081');
        const after = await second.stats();
        expect(after.deniedEgress).toBeGreaterThanOrEqual(1);
        expect(after.network?.denied).toEqual([`${upstream.address}:8080/tcp`]);
      } finally {
        await second.close();
      }

      // the same rules as the tenant before: nothing of its record or count either
      const third = await nextTenant(['mirror:second']);
      try {
        expect(await addressOf(third)).toBe(address);
        const fresh = await third.stats();
        expect(fresh.deniedEgress).toBe(0);
        expect(fresh.network?.denied ?? []).toEqual([]);
        expect(await fetchId(third, upstream.address, 8081)).toBe('port 8081');
        expect(await fetchId(third, upstream.address, 8080)).toBe('refused');
        expect((await third.stats()).deniedEgress).toBeGreaterThanOrEqual(1);
      } finally {
        await third.close();
      }

      // no rules: loopback only, as a new container has
      const fourth = await nextTenant([]);
      try {
        expect(await addressOf(fourth)).toBe('');
        expect((await fourth.exec(['ip', '-o', 'link'])).stdout).not.toContain('eth0');
        expect(await fetchId(fourth, upstream.address, 8081)).toBe('refused');
      } finally {
        await fourth.close();
      }
    }));

  it('counts a refusal that comes after a quiet reading, however soon', () =>
    attack('pooled-network', 'hide refused egress behind a cached count', async () => {
      const sandbox = await nextTenant(['mirror:first']);
      try {
        let counted = 0;
        for (let round = 1; round <= 3; round++) {
          // read while quiet (kept), then refused, read again at once
          await sandbox.stats();
          expect((await sandbox.stats()).deniedEgress).toBe(counted);
          expect(await fetchId(sandbox, upstream.address, 8081)).toBe('refused');
          const now = (await sandbox.stats()).deniedEgress;
          expect(now).toBeGreaterThan(counted);
          counted = now;
        }
      } finally {
        await sandbox.close();
      }
    }));
});
