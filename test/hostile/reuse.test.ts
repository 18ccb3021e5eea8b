import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ContainerSandbox } from '../../src/backends/container/container-sandbox.ts';
import type { Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

/** What a tenant can change of its sandbox's agent (pid 1) from inside, as it reads from there. */
const AGENT_STATE = [
  'grep -E "open files|processes|file size|core file" /proc/1/limits',
  'cut -d" " -f18,19 /proc/1/stat', // priority, nice
  'ionice -p 1',
  'taskset -p 1 | cut -d: -f2',
  'cat /proc/1/autogroup | cut -d" " -f2-',
].join('; ');

/** Every way a tenant of the same uid may change its agent from outside. */
const POISON_AGENT = [
  'prlimit --pid 1 --nofile=64:64 --nproc=64:64 --fsize=1048576:1048576 --core=0:0',
  'renice -n 15 -p 1',
  'ionice -c 3 -p 1',
  'taskset -p 1 1',
  'echo 19 > /proc/1/autogroup',
  'echo 1000 > /proc/1/oom_score_adj',
].join('; ');

async function run(sandbox: Sandbox, command: string): Promise<string> {
  const result = await sandbox.exec(['sh', '-c', command], { timeoutMs: 30_000 });
  return `${result.stdout}${result.stderr}`;
}

/**
 * Warm shells and FnCall workers serve one tenant after another: nothing a tenant did to its
 * sandbox's agent, or to its share of the node's pseudo-terminals, may reach the next one.
 */
describe('reuse of warm sandboxes', () => {
  let env: TestPlatform;
  let pristine: string;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-reuse', {
      privateStore: true,
      seed: ['debian:bookworm'],
      warmPool: { latency: 1 },
    });
    await env.platform.warmPool.filled(60_000);
    const fresh = await env.platform.createSandbox({ environment: 'debian:bookworm' });
    try {
      pristine = await run(fresh, AGENT_STATE);
    } finally {
      await fresh.close();
    }
    await env.platform.warmPool.filled(60_000);
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('hands a scrubbed shell to the next tenant when its agent was left alone', async () => {
    const first = (await env.platform.createSandbox({ environment: 'debian:bookworm' })) as ContainerSandbox;
    const slot = first.slot;
    await run(first, 'sleep 1 & echo hi > /tmp/x');
    await first.close();
    await env.platform.warmPool.recycled();
    await env.platform.warmPool.filled(60_000);
    const next = (await env.platform.createSandbox({ environment: 'debian:bookworm' })) as ContainerSandbox;
    try {
      expect(next.slot).toBe(slot);
      expect(await run(next, AGENT_STATE)).toBe(pristine);
    } finally {
      await next.close();
    }
  });

  it('never hands the next tenant a shell whose agent a tenant changed', () =>
    attack('reuse', 'poison a warm shell agent', async () => {
      await env.platform.warmPool.filled(60_000);
      const poisoner = (await env.platform.createSandbox({
        environment: 'debian:bookworm',
      })) as ContainerSandbox;
      const slot = poisoner.slot;
      await run(poisoner, POISON_AGENT);
      expect(await run(poisoner, AGENT_STATE)).not.toBe(pristine); // the poison took
      await poisoner.close();
      await env.platform.warmPool.recycled();
      await env.platform.warmPool.filled(60_000);
      const next = (await env.platform.createSandbox({ environment: 'debian:bookworm' })) as ContainerSandbox;
      try {
        expect(next.slot).not.toBe(slot);
        expect(await run(next, AGENT_STATE)).toBe(pristine);
      } finally {
        await next.close();
      }
    }));

  it('keeps the agent out of reach of a tenant that raises its OOM score', () =>
    attack('reuse', 'raise the agent OOM score', async () => {
      const sandbox = (await env.platform.createSandbox({
        environment: 'debian:bookworm',
      })) as ContainerSandbox;
      try {
        await run(
          sandbox,
          'echo 1000 > /proc/1/oom_score_adj; echo 1000 > /proc/1/task/1/oom_score_adj; echo 15 > /proc/1/oom_adj',
        );
        const [agent] = await sandbox.cgroup.members();
        expect(readFileSync(`/proc/${agent}/oom_score_adj`, 'utf8').trim()).not.toBe('1000');
      } finally {
        await sandbox.close();
      }
    }));

  it('gives each FnCall call an agent no earlier call changed', () =>
    attack('reuse', 'poison a FnCall worker agent', async () => {
      const fn = await env.platform.createSandbox({ backend: 'fncall', environment: 'debian:bookworm' });
      try {
        const before = await run(fn, AGENT_STATE);
        await run(fn, POISON_AGENT);
        expect(await run(fn, AGENT_STATE)).toBe(before);
      } finally {
        await fn.close();
      }
    }));

  it('leaves a neighbour its pseudo-terminals while a sandbox holds all it may', () =>
    attack('reuse', 'exhaust pseudo-terminals', async () => {
      const hog = await env.platform.createSandbox({ environment: 'debian:bookworm' });
      const neighbour = await env.platform.createSandbox({ environment: 'debian:bookworm' });
      try {
        // holds as many as it can get, in a process that stays, and says how many that was
        const held = await run(
          hog,
          `python3 -c "
import os, pty, sys, time
fds = []
try:
    while len(fds) < 5000:
        fds.append(pty.openpty())
except OSError:
    pass
print(len(fds), flush=True)
os.close(1); os.close(2)
time.sleep(60)
" & sleep 3`,
        );
        expect(Number(held.trim())).toBeGreaterThan(0);
        expect(Number(held.trim())).toBeLessThanOrEqual(256);
        expect(await run(neighbour, 'python3 -c "import pty; pty.openpty(); print(\'ok\')"')).toBe('ok\n');
      } finally {
        await hog.close();
        await neighbour.close();
      }
    }));
});
