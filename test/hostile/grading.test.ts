import { chmod, cp, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TOOLING_CHEATS } from '../../examples/agents/cheats.ts';
import { SandboxEnv, loadHarborTask, type SandboxAction, type Task } from '../../src/env/index.ts';
import { oracleAgent, evaluate, type EpisodeReport } from '../../src/rollout/index.ts';
import { createTestPlatform, playEpisode, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const PYTEST_TASK = resolve('test/hostile/tasks/pytest-answer');
const HELLO_TASK = resolve('examples/tasks/hello-file');

/**
 * Reward only for real work: cheats at the verifier's tooling, diffs built to break the grader,
 * and failures an agent causes on purpose so that its episode is masked rather than scored.
 */
describe('grading integrity', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-grading', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  const play = (task: Task, actions: SandboxAction[]): Promise<EpisodeReport> =>
    playEpisode(env.platform, task, actions);

  /** A copy of a task folder with some of its files changed. */
  async function variant(from: string, name: string, files: Record<string, string>): Promise<Task> {
    const dir = join(env.dataDir, 'tasks', `${name}-${Math.random().toString(36).slice(2, 8)}`);
    await mkdir(dir, { recursive: true });
    await cp(from, dir, { recursive: true });
    for (const [path, content] of Object.entries(files))
      await writeFile(join(dir, path), content, { mode: 0o755 });
    return loadHarborTask(dir);
  }

  it('grades the pytest task: the oracle passes and doing nothing fails', async () => {
    const task = await loadHarborTask(PYTEST_TASK);
    const [oracle] = await evaluate(env.platform, [task], oracleAgent, { concurrency: 1 });
    expect(oracle).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
    expect(await play(task, [])).toMatchObject({ reward: 0, outcome: { kind: 'ok' } });
  });

  // cheat-hang-tests has a test of its own below: it also checks who is blamed
  for (const [name, actions] of Object.entries(TOOLING_CHEATS).filter(([n]) => n !== 'cheat-hang-tests')) {
    it(`scores ${name} 0, never a pass or a masked episode`, () =>
      attack('grading', name, async () => {
        const report = await play(await loadHarborTask(PYTEST_TASK), actions);
        expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
        expect(report.reward, JSON.stringify(report.details)).toBe(0);
      }));
  }

  it('says which entries of an unpackable diff it left out', async () => {
    const report = await play(
      await loadHarborTask(PYTEST_TASK),
      TOOLING_CHEATS['cheat-unpackable-diff'] ?? [],
    );
    const dropped = (report.details as { droppedFromDiff?: { path: string; reason: string }[] })
      .droppedFromDiff;
    expect(dropped?.map((entry) => entry.reason).sort()).toEqual([
      'name_too_long',
      'path_too_long',
      'special_file',
    ]);
  });

  it('keeps a symlink in place of a protected folder out of the diff, and reports it as tampering', async () => {
    const report = await play(
      await loadHarborTask(PYTEST_TASK),
      TOOLING_CHEATS['cheat-symlink-folder'] ?? [],
    );
    expect(report.tampered).toEqual(expect.arrayContaining(['/usr/local/bin', '/usr/local/sbin']));
  });

  it('scores cheat-hang-tests 0, blaming the agent since the verifier runs soundly without its changes', () =>
    attack('grading', 'cheat-hang-tests', async () => {
      const report = await play(await loadHarborTask(PYTEST_TASK), TOOLING_CHEATS['cheat-hang-tests'] ?? []);
      expect(report).toMatchObject({ reward: 0, outcome: { kind: 'ok' } });
      expect(report.details?.['anomaly']).toMatch(/ran out of their 10000 ms/);
    }));

  it('blames a verifier that fails without the agent too: verifier_error', async () => {
    const broken = await variant(HELLO_TASK, 'no-reward', {
      'tests/test.sh': '#!/bin/bash\necho "grader config not found"\nexit 3\n',
    });
    const report = await play(broken, []);
    expect(report.outcome).toMatchObject({
      kind: 'verifier_error',
      message: expect.stringMatching(/without writing .*reward.* without them too/) as unknown,
    });
    // what the verifier said is in the outcome, so a report of it shows why
    expect((report.outcome as { message: string }).message).toMatch(
      /output ended with:\ngrader config not found/,
    );
  });

  for (const [value, why] of [
    ['nan', /not a number/],
    ['inf', /not a number/],
    ['1e999', /not a finite number in \[0, 1\]/],
    ['2', /not a finite number in \[0, 1\]/],
    ['-0.5', /not a finite number in \[0, 1\]/],
  ] as const) {
    it(`takes a reward of ${value} for the verifier's fault, never for a reward`, async () => {
      const script = `#!/bin/bash\necho ${value} > /logs/verifier/reward.txt\n`;
      const report = await play(await variant(HELLO_TASK, 'bad-reward', { 'tests/test.sh': script }), []);
      expect(report.outcome.kind).toBe('verifier_error');
      expect((report.outcome as { message: string }).message).toMatch(why);
    });
  }

  it('takes a reward.json with a non-number or out-of-range metric for the verifier fault', async () => {
    for (const json of ['{"reward": "1"}', '{"a": 1, "b": 7}', '[1]', '{"reward": {"x": 1}}']) {
      const script = `#!/bin/bash\necho '${json}' > /logs/verifier/reward.json\n`;
      const report = await play(await variant(HELLO_TASK, 'bad-json', { 'tests/test.sh': script }), []);
      expect(report.outcome.kind, json).toBe('verifier_error');
    }
  });

  it('keeps every metric of a sound reward.json', async () => {
    const script = `#!/bin/bash\necho '{"accuracy": 0.5, "style": 1}' > /logs/verifier/reward.json\n`;
    const report = await play(await variant(HELLO_TASK, 'metrics', { 'tests/test.sh': script }), []);
    expect(report).toMatchObject({ reward: 0.75, details: { metrics: { accuracy: 0.5, style: 1 } } });
  });

  it('scores an agent that makes the OOM killer end its sandbox agent, instead of masking it', () =>
    attack('grading', 'oom the sandbox agent', async () => {
      const small = await variant(HELLO_TASK, 'small', {
        'task.toml': '[environment]\nmemory_mb = 64\n[verifier]\ntimeout_sec = 30\n',
      });
      // reading a file nearly the size of the sandbox's memory makes its agent the largest process
      const report = await play(small, [
        { type: 'exec', command: 'head -c 60000000 /dev/zero > /tmp/big' },
        { type: 'read_file', path: '/tmp/big' },
      ]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(report.reward).toBe(0);
      // the agent did die of the sandbox's own OOM, and the step says so
      const [, step] = await (await env.platform.stepLog(report.sandboxId!)).records();
      expect(step?.result, JSON.stringify(step?.result)).toMatchObject({
        observation: { type: 'error', code: 'oom' },
        outcome: { kind: 'ok' },
        terminated: true,
      });
    }));

  it('does not flag an honest agent whose Python writes bytecode caches', async () => {
    const gym = SandboxEnv.create(env.platform, {
      sandbox: { environment: 'debian:bookworm' },
      protectedPaths: ['/usr/lib', '/usr/local/lib'],
    });
    try {
      await gym.reset();
      const step = await gym.step({
        type: 'exec',
        command: ['python3', '-c', 'import json, email.mime.text, xml.dom.minidom, pytest'],
      });
      expect(step.observation).toMatchObject({ type: 'exec', exitCode: 0 });
      expect(step.info.signals).toMatchObject({ protectedChanges: [] });
      // the standard library's caches were valid: nothing was rewritten under /usr/lib
      const written = await gym.current!.writtenPaths(['/usr/lib']);
      expect(written).toEqual([]);
    } finally {
      await gym.close();
    }
  });

  it('runs the grader on a task whose test script is not executable', async () => {
    const task = await variant(HELLO_TASK, 'not-executable', {
      'tests/test.sh': '#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n',
    });
    await chmod(join(task.source, 'tests', 'test.sh'), 0o644);
    const report = await play(task, []);
    expect(report).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
  });
});
