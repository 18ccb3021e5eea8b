import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ContainerSandbox } from '../../src/backends/container/container-sandbox.ts';
import { detectCriu } from '../../src/backends/host/criu.ts';
import { signalProcess } from '../../src/backends/host/processes.ts';
import { SandboxEnv, type SandboxAction } from '../../src/env/index.ts';
import type { Sandbox } from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const criu = await detectCriu();

/**
 * The sandbox's agent serves one request at a time: what a sandbox plants must never make a file
 * call or a command wait forever, and every call has a deadline besides. Each attack is followed
 * by a command that must still be served.
 */
describe('the agent API under attack', () => {
  let env: TestPlatform;
  let sandbox: Sandbox;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-agent-api');
    sandbox = await env.platform.createSandbox({ environment: 'busybox:latest' });
  });

  afterAll(async () => {
    await sandbox?.close();
    await env?.[Symbol.asyncDispose]();
  });

  async function stillServed(): Promise<void> {
    expect((await sandbox.exec(['echo', 'served'], { timeoutMs: 10_000 })).stdout).toBe('served\n');
  }

  it('refuses to read a FIFO, at once', () =>
    attack('agent-api', 'read_file on a FIFO', async () => {
      await sandbox.exec(['mkfifo', '/tmp/pipe']);
      await expectCode(sandbox.readFile('/tmp/pipe', { timeoutMs: 10_000 }), 'failed_precondition', /FIFO/);
      await stillServed();
    }));

  it('writes a file whatever the sandbox planted where a temp file could go', () =>
    attack('agent-api', 'FIFOs at write temp paths', async () => {
      // the names an agent once used for its temp files, and a few more
      await sandbox.exec(['sh', '-c', 'for n in 1 2 3 100; do mkfifo /tmp/.sandgym-write-$n; done']);
      await sandbox.writeFile('/tmp/written', 'content', { timeoutMs: 10_000 });
      expect((await sandbox.readFile('/tmp/written')).toString()).toBe('content');
      await stillServed();
    }));

  it('names a NUL byte in a command environment, argument or folder', () =>
    attack('agent-api', 'NUL bytes in a command', async () => {
      await expectCode(sandbox.exec(['echo'], { env: { X: 'a\0b' } }), 'invalid_argument', /NUL/);
      await expectCode(sandbox.exec(['echo'], { env: { 'A\0B': 'x' } }), 'invalid_argument', /NUL/);
      await expectCode(sandbox.exec(['echo', 'a\0b']), 'invalid_argument', /NUL/);
      await expectCode(sandbox.exec(['echo'], { cwd: '/tmp\0x' }), 'invalid_argument', /NUL/);
      await stillServed();
    }));

  it('refuses a NUL byte in an action at the gym door', () =>
    attack('agent-api', 'NUL bytes in an action', async () => {
      const gym = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
      try {
        await gym.reset();
        // refused before anything runs, as an observation of the step (a policy's mistake is
        // scored, never an error a rollout would mask; see policy-failures.test.ts)
        const actions: SandboxAction[] = [
          { type: 'exec', command: ['echo'], env: { X: 'a\0b' } },
          { type: 'read_file', path: '/etc/\0passwd' },
        ];
        for (const action of actions) {
          const refused = await gym.step(action);
          expect(refused.observation).toMatchObject({ type: 'error', code: 'invalid_action' });
          expect((refused.observation as { message: string }).message).toMatch(/NUL/);
        }
      } finally {
        await gym.close();
      }
    }));

  it('gives up on every kind of call to an agent that does not answer, within its deadline', () =>
    attack('agent-api', 'an agent that never answers', async () => {
      const stuck = (await env.platform.createSandbox({ environment: 'busybox:latest' })) as ContainerSandbox;
      try {
        const [agent] = await stuck.cgroup.members();
        signalProcess(agent!, 'SIGSTOP');
        const deadline = { timeoutMs: 500 };
        await expectCode(stuck.readFile('/etc/passwd', deadline), 'timeout', /took longer than 500 ms/);
        await expectCode(stuck.writeFile('/tmp/x', 'x', deadline), 'timeout');
        await expectCode(stuck.listDir('/', deadline), 'timeout');
        signalProcess(agent!, 'SIGCONT');
      } finally {
        await stuck.close();
      }
    }));

  it.skipIf(!criu.usable)(
    'keeps a file named like the node channel the tenant file it is, across a memory hibernation',
    () =>
      attack('agent-api', 'a lookalike of the agent channel held across a process checkpoint', async () => {
        // the node's FIFOs are <data>/sandboxes/<id>/agent.*; from outside, a tenant file
        // /<id>/agent.responses in the container's root reads the same. It must stay the tenant's.
        const target = await env.platform.createSandbox({ environment: 'busybox:latest' });
        try {
          const fake = `/${target.id}/agent.responses`;
          await target.exec([
            'sh',
            '-c',
            `mkdir -p /${target.id} && sh -c 'exec 7<>${fake}; while true; do if [ -e /tmp/go ]; then echo forged >&7; rm /tmp/go; fi; sleep 0.1; done' >/dev/null 2>&1 &`,
          ]);
          const report = await target.hibernate();
          expect(report.imageBytes).toBeGreaterThan(0);
          // restored by the next request; the holder then writes through what it holds
          await target.exec(['touch', '/tmp/go']);
          for (let i = 0; (await target.exec(['test', '-e', '/tmp/go'])).exitCode === 0; i++) {
            if (i > 100) throw new Error('the holder never wrote');
            await new Promise((done) => setTimeout(done, 100));
          }
          expect((await target.readFile(fake)).toString()).toBe('forged\n');
          expect((await target.exec(['echo', 'served'], { timeoutMs: 10_000 })).stdout).toBe('served\n');
        } finally {
          await target.close();
        }
      }),
  );
});
