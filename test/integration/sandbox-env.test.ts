import { spawnSync } from 'node:child_process';
import { appendFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { SandboxEnv, replayTrajectory, withStepLimit, type SandboxAction } from '../../src/env/index.ts';
import { TrajectoryLog } from '../../src/platform/index.ts';
import { createMsgpackCodec } from '../../src/common/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const STAMP: SandboxAction = { type: 'exec', command: 'date +%s%N >> /tmp/stamps; wc -l < /tmp/stamps' };

describe('SandboxEnv and exactly-once steps', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('sandbox-env', { privateStore: true });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('runs structured actions and terminates on submit', async () => {
    await using gym = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    const reset = await gym.reset({ seed: 7 });
    expect(reset.observation).toMatchObject({ type: 'reset', environment: 'busybox:latest' });
    const wrote = await gym.step({ type: 'write_file', path: '/work/a.txt', content: 'hello' });
    expect(wrote.observation).toEqual({ type: 'written', path: '/work/a.txt' });
    const ran = await gym.step({ type: 'exec', command: ['cat', '/work/a.txt'] });
    expect(ran.observation).toMatchObject({ type: 'exec', stdout: 'hello', exitCode: 0 });
    expect(ran.outcome).toEqual({ kind: 'ok' });
    const listed = await gym.step({ type: 'list_dir', path: '/work' });
    expect(listed.observation).toMatchObject({
      type: 'dir',
      entries: [{ name: 'a.txt', type: 'file', size: 5 }],
    });
    const missing = await gym.step({ type: 'read_file', path: '/nope' });
    expect(missing.observation).toMatchObject({ type: 'error', code: 'not_found' });
    const submitted = await gym.step({ type: 'submit' });
    expect(submitted.terminated).toBe(true);
    // an invalid action is an observation of its step, never a throw a rollout would mask
    const invalid = await gym.step({ type: 'exec', command: [] } as unknown as SandboxAction);
    expect(invalid.observation).toMatchObject({ type: 'error', code: 'invalid_action' });
    expect(invalid.outcome).toEqual({ kind: 'ok' });
  });

  it('keeps working directory and exported variables between steps of a shell session', async () => {
    await using gym = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    await gym.reset();
    const stdout = async (action: SandboxAction): Promise<string> => {
      const result = await gym.step(action);
      return result.observation.type === 'exec'
        ? result.observation.stdout
        : JSON.stringify(result.observation);
    };
    await stdout({
      type: 'exec',
      command: 'mkdir -p /work/deep && cd /work/deep && export GREETING=hi',
      session: 'main',
    });
    expect(await stdout({ type: 'exec', command: 'pwd; echo "$GREETING"', session: 'main' })).toBe(
      '/work/deep\nhi\n',
    );
    // a program, not a shell line, starts there too and sees the variables
    expect(
      await stdout({ type: 'exec', command: ['sh', '-c', 'pwd; echo "$GREETING"'], session: 'main' }),
    ).toBe('/work/deep\nhi\n');
    // an explicit cwd and env for one command become the session's from then on
    await stdout({ type: 'exec', command: 'true', cwd: '/tmp', env: { MORE: 'yes' }, session: 'main' });
    expect(await stdout({ type: 'exec', command: 'pwd; echo "$GREETING $MORE"', session: 'main' })).toBe(
      '/tmp\nhi yes\n',
    );
    // other sessions, and commands outside any session, start afresh
    expect(await stdout({ type: 'exec', command: 'pwd; echo "[$GREETING]"', session: 'other' })).toBe(
      '/\n[]\n',
    );
    expect(await stdout({ type: 'exec', command: 'pwd; echo "[$GREETING]"' })).toBe('/\n[]\n');
    // exit codes and quoting pass through untouched
    const failed = await gym.step({
      type: 'exec',
      command: `printf '%s|' "a b" 'c"d'; exit 3`,
      session: 'main',
    });
    expect(failed.observation).toMatchObject({ stdout: 'a b|c"d|', exitCode: 3 });
  });

  it('runs each step exactly once across a client crash, and refuses a diverging step', async () => {
    const first = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    await first.reset();
    try {
      for (let i = 0; i < 5; i++)
        expect((await first.step(STAMP)).observation).toMatchObject({ stdout: `${i + 1}\n` });
      // the first client "crashes": it is dropped mid-episode; a new client attaches and retries from step 0
      const sandbox = first.current!;
      const second = await SandboxEnv.attach(env.platform, sandbox, first.episode);
      for (let i = 0; i < 5; i++) {
        const again = await second.step(STAMP);
        expect(again.info.replayed).toBe(true);
        expect(again.observation).toMatchObject({ stdout: `${i + 1}\n` });
      }
      const fresh = await second.step(STAMP);
      expect(fresh.info.replayed).toBe(false);
      const lines = await sandbox.exec(['wc', '-l', '/tmp/stamps']);
      expect(lines.stdout.trim().split(/\s+/)[0]).toBe('6');
      const third = await SandboxEnv.attach(env.platform, sandbox, first.episode);
      const error: unknown = await third
        .step({ type: 'exec', command: 'rm -rf /work' })
        .catch((e: unknown) => e);
      expect(isSandgymError(error, 'divergence')).toBe(true);
      expect((error as Error).message).toMatch(/Step 0 of episode .* diverges/);
      // the log on disk holds the six steps, and a torn tail from a crash mid-write is cut off
      const log = await env.platform.trajectory(sandbox.id);
      await appendFile(log.path, Buffer.from([0, 0, 0, 99, 1, 2]));
      const reopened = await TrajectoryLog.open(log.path, createMsgpackCodec());
      expect(reopened.episode(first.episode).map((r) => r.stepIndex)).toEqual([0, 1, 2, 3, 4, 5]);
      await reopened.close();
    } finally {
      await first.close();
    }
  });

  it('reports a sandbox that dies under a step as an infrastructure outcome, not a reward', async () => {
    await using gym = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    const { observation } = await gym.reset();
    // the agent dies from outside, as when the node OOM-kills it or a host admin kills it
    const id = (observation as { sandboxId: string }).sandboxId;
    const state = spawnSync('crun', ['--root', join(env.dataDir, 'runtime'), 'state', id], {
      encoding: 'utf8',
    });
    process.kill((JSON.parse(state.stdout) as { pid: number }).pid, 'SIGKILL');
    for (let i = 0; i < 100 && gym.current?.state === 'running'; i++)
      await new Promise((r) => setTimeout(r, 20));
    const step = await gym.step({ type: 'exec', command: ['true'] });
    expect(step.outcome).toMatchObject({ kind: 'infra_failure', reason: 'agent_crash' });
    expect(step.truncated).toBe(true);
  });

  it('checkpoints the filesystem and restores it into a new sandbox', async () => {
    await using gym = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    await gym.reset();
    await gym.step({ type: 'write_file', path: '/work/kept.txt', content: 'before the checkpoint' });
    // files only, as an environment: what a restore in a new sandbox starts from
    const ref = await gym.checkpoint({ depth: 'disk' });
    expect(ref).toMatchObject({ stepIndex: 1, depth: 'disk' });
    await gym.step({ type: 'exec', command: 'rm /work/kept.txt && echo later > /work/lost.txt' });
    const first = gym.current!;
    const restored = await gym.restore(ref);
    expect(restored.info.restoredFrom).toEqual(ref);
    expect(first.state).toBe('stopped');
    const seen = await gym.step({ type: 'exec', command: 'cat /work/kept.txt; ls /work' });
    expect(seen.observation).toMatchObject({ stdout: 'before the checkpointkept.txt\n' });
    expect(seen.info.stepIndex).toBe(0);
  });

  it('replays a logged episode in a fresh sandbox and finds where it stops matching', async () => {
    await using gym = SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    await gym.reset();
    await gym.step({ type: 'write_file', path: '/work/n', content: '1' });
    await gym.step({ type: 'exec', command: 'cat /work/n; echo; ls /work' });
    await gym.step({ type: 'exec', command: ['cat', '/proc/sys/kernel/random/uuid'] });
    const records = (await env.platform.trajectory(gym.current!.id)).episode(gym.episode);
    const same = await replayTrajectory(env.platform, 'busybox:latest', records.slice(0, 2));
    expect(same).toEqual({ steps: 2, matched: true });
    // a random uuid cannot repeat: replay reports the step where the trajectory stops being reproducible
    const differs = await replayTrajectory(env.platform, 'busybox:latest', records);
    expect(differs).toMatchObject({ steps: 3, matched: false, mismatch: { stepIndex: 2 } });
  });

  it('truncates an episode at a step limit', async () => {
    await using gym = withStepLimit(
      SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } }),
      2,
    );
    await gym.reset();
    expect((await gym.step({ type: 'exec', command: ['true'] })).truncated).toBe(false);
    const last = await gym.step({ type: 'exec', command: ['true'] });
    expect(last.truncated).toBe(true);
    expect(last.info.truncatedBy).toBe('step_limit');
  });
});
