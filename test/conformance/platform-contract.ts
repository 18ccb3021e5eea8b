import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PlatformClient, Sandbox } from '../../src/platform/index.ts';
import { SandboxEnv } from '../../src/env/index.ts';
import { expectCode } from '../support/errors.ts';
import { isSandgymError } from '../../src/common/index.ts';

/** How a way of running sandgym joins the contract suite. */
export interface PlatformTarget {
  name: string;
  /**
   * A ready client, plus (where projects exist) a client of another project on the same
   * platform, to prove one project cannot see another's sandboxes.
   */
  open(): Promise<{ platform: PlatformClient; otherProject?: PlatformClient; dispose(): Promise<void> }>;
}

/** Polls a condition (no wall-clock assertion: a generous bound, then a clear failure). */
async function waitFor(condition: () => Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** The PlatformClient contract: the embedded platform and the cluster client keep it alike. */
export function describePlatformContract(target: PlatformTarget): void {
  describe(`platform contract: ${target.name}`, () => {
    let opened: Awaited<ReturnType<PlatformTarget['open']>>;
    let sandbox: Sandbox;

    beforeAll(async () => {
      opened = await target.open();
      sandbox = await opened.platform.createSandbox({
        environment: 'busybox:latest',
        resources: { memoryMib: 64 },
      });
    });

    afterAll(async () => {
      try {
        await sandbox?.close();
      } finally {
        await opened?.dispose();
      }
    });

    it('runs commands and reports output and exit codes', async () => {
      const ok = await sandbox.exec(['sh', '-c', 'echo out; echo err >&2; exit 3']);
      expect(ok).toMatchObject({ exitCode: 3, stdout: 'out\n', stderr: 'err\n', timedOut: false });
      const slow = await sandbox.exec(['sleep', '5'], { timeoutMs: 300 });
      expect(slow.timedOut).toBe(true);
    });

    it('streams output before the command ends', async () => {
      const running = sandbox.execStream(['sh', '-c', 'echo first; sleep 0.3; echo second']);
      const chunks: string[] = [];
      for await (const chunk of running.output) chunks.push(chunk.data.toString());
      expect(chunks.join('')).toBe('first\nsecond\n');
      expect(chunks.length).toBeGreaterThanOrEqual(2);
      expect((await running.result).exitCode).toBe(0);
    });

    it('writes, reads and lists files', async () => {
      await sandbox.writeFile('/tmp/contract/a.txt', 'hello', { mode: 0o600 });
      expect((await sandbox.readFile('/tmp/contract/a.txt')).toString()).toBe('hello');
      const entries = await sandbox.listDir('/tmp/contract');
      expect(entries).toEqual([expect.objectContaining({ name: 'a.txt', type: 'file', size: 5 })]);
      await expectCode(sandbox.readFile('/tmp/contract/missing'), 'not_found');
    });

    it('pauses and resumes', async () => {
      await sandbox.pause();
      expect((await sandbox.stats()).state).toBe('paused');
      await sandbox.resume();
      expect((await sandbox.exec(['true'])).exitCode).toBe(0);
    });

    it('rejects a bad request with a message that names the field', async () => {
      await expectCode(
        opened.platform.createSandbox({ resources: { memoryMib: 1 } }),
        'invalid_argument',
        /resources\.memoryMib/,
      );
      await expectCode(
        opened.platform.createSandbox({ enviroment: 'busybox:latest' } as never),
        'invalid_argument',
        /enviroment/,
      );
      await expectCode(opened.platform.createSandbox({ environment: 'nope:1' }), 'not_found');
    });

    it('lists and kills sandboxes', async () => {
      const extra = await opened.platform.createSandbox({
        environment: 'busybox:latest',
        resources: { memoryMib: 64 },
      });
      try {
        expect((await opened.platform.listSandboxes()).map((r) => r.id)).toContain(extra.id);
        await opened.platform.killSandbox(extra.id);
        expect((await opened.platform.listSandboxes()).map((r) => r.id)).not.toContain(extra.id);
      } finally {
        await extra.close();
      }
    });

    it('runs each step exactly once, even for a second client attached to the episode', async () => {
      const env = SandboxEnv.create(opened.platform, {
        sandbox: { environment: 'busybox:latest', resources: { memoryMib: 64 } },
      });
      try {
        const reset = await env.reset({ options: { episodeId: 'contract' } });
        const step = { type: 'exec' as const, command: 'date +%s%N >> /tmp/steps; wc -l < /tmp/steps' };
        const first = await env.step(step);
        expect(first.observation).toMatchObject({ type: 'exec', stdout: '1\n' });
        const live = env.current as Sandbox;
        // a second client (a restarted trainer) attaches and replays step 0 from the node's log
        const again = await SandboxEnv.attach(opened.platform, live, 'contract');
        const replayed = await again.step(step);
        expect(replayed.info.replayed).toBe(true);
        expect(replayed.observation).toEqual(first.observation);
        expect((await live.readFile('/tmp/steps')).toString().trim().split('\n')).toHaveLength(1);
        // a client that asks for something else at a logged index gets a typed divergence
        const stray = await SandboxEnv.attach(opened.platform, live, 'contract');
        await expectCode(stray.step({ type: 'exec', command: 'echo other' }), 'divergence');
        const records = await (await opened.platform.stepLog(reset.info.sandboxId)).records();
        expect(records.filter((r) => r.episodeId === 'contract')).toHaveLength(1);
      } finally {
        await env.close();
      }
    });

    it('packs a sandbox diff into an environment new sandboxes start from', async () => {
      await sandbox.writeFile('/root/packed.txt', 'from the diff');
      const name = `contract-${Date.now().toString(36)}:v1`;
      const { environment } = await opened.platform.packDiff(sandbox, { name });
      expect(environment?.layers.length).toBeGreaterThan(1);
      expect((await opened.platform.listEnvironments()).map((e) => `${e.name}:${e.version}`)).toContain(name);
      const child = await opened.platform.createSandbox({ environment: name, resources: { memoryMib: 64 } });
      try {
        expect((await child.readFile('/root/packed.txt')).toString()).toBe('from the diff');
      } finally {
        await child.close();
      }
    });

    it("hides one project's sandboxes from another", async (context) => {
      const other = opened.otherProject;
      if (!other) return context.skip();
      expect((await other.listSandboxes()).map((r) => r.id)).not.toContain(sandbox.id);
      await expectCode(other.killSandbox(sandbox.id), 'not_found');
      expect((await sandbox.exec(['true'])).exitCode).toBe(0);
      await expectCode(other.attachSandbox(sandbox.id), 'not_found');
      await expectCode(
        other.stepLog(sandbox.id).then((log) => log.records()),
        'not_found',
      );
      await expectCode(other.packDiff(sandbox.id, { name: 'stolen:v1' }), 'not_found');
    });

    it('forks a sandbox into a group that diverges independently and is cleaned up together', async () => {
      await sandbox.writeFile('/root/state.txt', 'before fork');
      const group = await opened.platform.fork(sandbox, 3);
      try {
        expect(group.sandboxes).toHaveLength(3);
        for (const [i, child] of group.sandboxes.entries()) {
          expect((await child.readFile('/root/state.txt')).toString()).toBe('before fork');
          await child.writeFile('/root/state.txt', `child ${i}`);
        }
        for (const [i, child] of group.sandboxes.entries()) {
          expect((await child.readFile('/root/state.txt')).toString()).toBe(`child ${i}`);
        }
        expect((await sandbox.readFile('/root/state.txt')).toString()).toBe('before fork');
      } finally {
        await group.close();
      }
      const live = (await opened.platform.listSandboxes()).map((r) => r.id);
      for (const child of group.sandboxes) expect(live).not.toContain(child.id);
    });

    it('couples a run to training phases, its lease and its end', async () => {
      const name = `run-${Date.now().toString(36)}`;
      const run = await opened.platform.startRun({ name, leaseMs: 60_000 });
      const request = { environment: 'busybox:latest', resources: { memoryMib: 64 }, run: name };
      const [idle, busy] = [
        await opened.platform.createSandbox(request),
        await opened.platform.createSandbox(request),
      ];
      try {
        const running = busy.exec(['sleep', '3']);
        await waitFor(async () => (await busy.exec(['true'])).exitCode === 0); // both up
        const slow = busy.exec(['sleep', '2.5']);
        const train = await run.phase('train');
        expect(train.paused).toContain(idle.id);
        expect(train.busy).toContain(busy.id); // a step is running in it: left alone
        expect((await idle.stats()).state).toBe('paused');
        await Promise.all([running, slow]);
        // preempted while a step runs: the busy one hibernates as soon as its step ends
        const step = busy.exec(['sleep', '1.5']);
        const preempted = await run.phase('preempted');
        expect(preempted.hibernated).toEqual([idle.id]);
        expect(preempted.busy).toEqual([busy.id]);
        expect((await idle.stats()).state).toBe('hibernated');
        expect((await step).exitCode).toBe(0);
        await waitFor(async () => (await busy.stats()).state === 'hibernated');
        // any request to a hibernated sandbox resumes it transparently
        expect((await idle.exec(['echo', 'back'])).stdout).toBe('back\n');
        const rollout = await run.phase('rollout');
        expect(rollout.resumed).toContain(busy.id);
        expect((await run.renew()).sandboxes).toBe(2);
        await expectCode(
          opened.platform.createSandbox({ ...request, run: 'no-such-run' }),
          'not_found',
          /startRun/,
        );
        // a snapshot of a member belongs to the run too
        const snapshot = `${name}-snap:v1`;
        await opened.platform.packDiff(idle, { name: snapshot });
        expect((await opened.platform.getEnvironment(snapshot)).name).toBe(`${name}-snap`);
        const ended = await run.end();
        expect(ended.destroyed.sort()).toEqual([idle.id, busy.id].sort());
        await expectCode(opened.platform.getEnvironment(snapshot), 'not_found');
        const live = (await opened.platform.listSandboxes()).map((r) => r.id);
        expect(live).not.toContain(idle.id);
        expect(live).not.toContain(busy.id);
      } finally {
        await idle.close().catch(() => undefined);
        await busy.close().catch(() => undefined);
      }
    });

    it('hibernates the sandboxes of a lapsed lease and cleans up an expired run', async () => {
      const name = `lease-${Date.now().toString(36)}`;
      const run = await opened.platform.startRun({ name, leaseMs: 400, ttlMs: 4_000 });
      const member = await opened.platform.createSandbox({
        environment: 'busybox:latest',
        resources: { memoryMib: 64 },
        run: name,
      });
      try {
        await waitFor(async () => (await member.stats()).state === 'hibernated');
        expect((await run.renew()).lapsed).toBe(false);
        expect((await member.stats()).state).toBe('running');
        // no renewals from here: lapse, then expiry destroys it
        await waitFor(async () => !(await opened.platform.listSandboxes()).some((r) => r.id === member.id));
        await expectCode(run.renew(), 'not_found');
      } finally {
        await member.close().catch(() => undefined);
      }
    });

    it('reclaims a sandbox left idle past its TTL, and a busy one at its hard deadline', async () => {
      const live = async (id: string): Promise<boolean> =>
        (await opened.platform.listSandboxes()).some((r) => r.id === id);
      const idle = await opened.platform.createSandbox({
        environment: 'busybox:latest',
        resources: { memoryMib: 64 },
        lifetime: { idleTtlMs: 500 },
      });
      const busy = await opened.platform.createSandbox({
        environment: 'busybox:latest',
        resources: { memoryMib: 64 },
        lifetime: { deadlineMs: 2_000 },
      });
      try {
        await waitFor(async () => !(await live(idle.id)));
        // kept busy, it still goes at its deadline
        let steps = 0;
        while (await live(busy.id)) {
          await busy.exec(['true']).catch(() => undefined);
          if (++steps > 400) throw new Error('the deadline never came');
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
        // the handle now fails: the sandbox is stopped (timeout), or already forgotten by its node
        const after: unknown = await busy.exec(['true']).then(
          () => undefined,
          (error: unknown) => error,
        );
        expect(isSandgymError(after, 'failed_precondition', 'not_found'), String(after)).toBe(true);
      } finally {
        await idle.close().catch(() => undefined);
        await busy.close().catch(() => undefined);
      }
    });

    it('destroys its sandboxes on close', async () => {
      const second = await target.open();
      const platform = second.platform;
      try {
        const made = await platform.createSandbox({
          environment: 'busybox:latest',
          resources: { memoryMib: 64 },
        });
        await platform.close();
        expect(made.state).toBe('stopped');
        const error: unknown = await made.exec(['true']).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(isSandgymError(error)).toBe(true);
      } finally {
        await second.dispose();
      }
    });
  });
}
