import { describe, expect, it } from 'vitest';
import { createTestPlatform } from '../support/platform.ts';

const SMALL = { environment: 'busybox:latest', resources: { memoryMib: 32 } };

/**
 * A node's default idle TTL reaps sandboxes outside a run that a client left behind (a crashed
 * client holds no lease to lapse), and leaves alone a run's sandboxes and those that asked for
 * a lifetime of their own.
 */
describe('the default idle TTL', () => {
  it('reclaims an idle sandbox outside a run, not a run member or one with its own TTL', async () => {
    await using test = await createTestPlatform('idle-ttl', { defaultIdleTtlMs: 500 });
    const { platform } = test;
    const run = await platform.startRun({ name: `idle-ttl-${process.pid}`, leaseMs: 600_000 });
    const live = async (): Promise<string[]> => (await platform.listSandboxes()).map((r) => r.id);
    // made first, so they have been idle longest: a default applied to them would take them first
    const member = await platform.createSandbox({ ...SMALL, run: run.name });
    const own = await platform.createSandbox({ ...SMALL, lifetime: { idleTtlMs: 3_600_000 } });
    const left = await platform.createSandbox(SMALL);
    try {
      expect(await live()).toEqual(expect.arrayContaining([member.id, own.id, left.id]));
      for (let polls = 0; (await live()).includes(left.id); polls++) {
        if (polls > 400) throw new Error('the sandbox left idle was never reclaimed');
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(await live()).toEqual(expect.arrayContaining([member.id, own.id]));
    } finally {
      await left.close().catch(() => undefined);
      await own.close();
      await run.end();
      await member.close().catch(() => undefined);
    }
  });
});
