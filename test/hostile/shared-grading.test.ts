import { appendFile, cp, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadTasks, type SandboxAction, type Task } from '../../src/env/index.ts';
import { checkTask } from '../../src/rollout/index.ts';
import { createTestPlatform, playEpisode, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const MONITOR_TASK = resolve('test/fixtures/tasks/checked/harbor-daemon-monitor');

/** The monitor task, graded the way `mode` says whatever its task.toml says. */
async function monitorTask(mode: 'fresh' | 'shared', dir = MONITOR_TASK): Promise<Task> {
  const [task] = await loadTasks([dir]);
  return { ...task!, verifierMode: mode };
}

/** Writes 1 to the reward file and a test.sh that does the same, as fast as it can, forever. */
const RACER =
  'nohup setsid sh -c \'while :; do echo 1 > /logs/verifier/reward.txt; printf "#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n" > /tests/test.sh; done\' >/dev/null 2>&1 </dev/null &';

/**
 * Grading in the agent's own sandbox (a task's shared verifier mode): tests that check what the
 * agent left running pass, and what the agent left at the graders' paths or left running as
 * another user than the tests cannot decide the reward. What a process left running as root can
 * still do there is docs/security.md's "Shared grading".
 */
describe('grading in the agent sandbox', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-shared', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it("passes a task whose tests check the agent's daemon only when graded in its sandbox", async () => {
    const shared = await playEpisode(env.platform, await monitorTask('shared'), 'oracle');
    expect(shared, JSON.stringify(shared.details)).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
    expect(shared.details?.['gradedIn']).toBe('the agent sandbox');
    // the same work in a fresh grader: the 0 names what was left behind and what to change
    const fresh = await playEpisode(env.platform, await monitorTask('fresh'), 'oracle');
    expect(fresh).toMatchObject({ reward: 0, outcome: { kind: 'ok' } });
    expect(fresh.details?.['leftoverProcesses']).toContain('monitor.sh');
    expect(String(fresh.details?.['leftoverNote'])).toContain('environment_mode = "shared"');
  });

  it('ends the episode when it grades in place: no step can read the tests afterwards', async () => {
    await using task = TaskEnv.create(env.platform, await monitorTask('shared'));
    await task.reset();
    const grade = await task.grade();
    expect(grade.reward).toBe(0);
    await expect(task.step({ type: 'exec', command: 'cat /tests/test.sh' })).rejects.toThrow(
      /graded in the agent's own sandbox.*reset\(\)/,
    );
    // a reset starts a new episode that steps again
    await task.reset();
    const step = await task.step({ type: 'exec', command: 'echo again' });
    expect(step.outcome).toEqual({ kind: 'ok' });
  });

  it('tells the task author which mode the task needs', async () => {
    const results = await checkTask(env.platform, await monitorTask('fresh'));
    const fits = results.find((r) => r.name === 'grading fits what the agent leaves running');
    expect(fits?.passed).toBe(false);
    expect(fits?.detail).toMatch(/only when graded in its own sandbox.*environment_mode = "shared"/);
    expect(fits?.detail).toContain('monitor.sh');
  });

  const plants: Record<string, SandboxAction[]> = {
    'a test.sh and a reward planted before grading': [
      {
        type: 'exec',
        command:
          'mkdir -p /tests /logs/verifier && printf "#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n" > /tests/test.sh && echo 1 > /logs/verifier/reward.txt',
      },
    ],
    "the graders' paths made links to the agent's own files": [
      {
        type: 'exec',
        command:
          'mkdir -p /app/fake/verifier /logs && echo 1 > /app/fake/verifier/reward.txt && ln -s /app/fake/verifier /logs/verifier && ln -s /app/fake /tests',
      },
    ],
  };
  it('scores a conftest.py planted among the tests 0', () =>
    attack('shared-grading', 'a conftest.py planted among the tests', async () => {
      const [task] = await loadTasks([resolve('test/fixtures/tasks/checked/tb-monitor-same-shell')]);
      expect(task?.verifierMode).toBe('shared');
      const conftest = [
        'import pytest',
        '@pytest.hookimpl(hookwrapper=True)',
        'def pytest_runtest_makereport(item, call):',
        '    outcome = yield',
        '    report = outcome.get_result()',
        '    report.outcome = "passed"',
      ].join('\\n');
      const report = await playEpisode(env.platform, task!, [
        { type: 'exec', command: `mkdir -p /tests && printf '${conftest}\\n' > /tests/conftest.py` },
      ]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(report.reward, JSON.stringify(report.details)).toBe(0);
    }));

  for (const [name, actions] of Object.entries(plants)) {
    it(`scores ${name} 0`, () =>
      attack('shared-grading', name, async () => {
        const report = await playEpisode(env.platform, await monitorTask('shared'), actions);
        expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
        expect(report.reward, JSON.stringify(report.details)).toBe(0);
      }));
  }

  it('keeps a racing process of a non-root agent away from the tests and the reward', () =>
    attack('shared-grading', 'a racing process left by a non-root agent', async () => {
      const dir = join(env.dataDir, 'tasks', 'monitor-as-worker');
      await mkdir(dir, { recursive: true });
      await cp(MONITOR_TASK, dir, { recursive: true });
      await appendFile(
        join(dir, 'environment', 'Dockerfile'),
        'RUN useradd -m worker && chown worker /app\n',
      );
      await writeFile(
        join(dir, 'task.toml'),
        '[verifier]\ntimeout_sec = 60\nenvironment_mode = "shared"\n[agent]\nuser = "worker"\n[environment]\nnetwork_mode = "no-network"\n',
      );
      const task = await monitorTask('shared', dir);
      expect(task.agentUser).toBe('worker');
      const report = await playEpisode(env.platform, task, [{ type: 'exec', command: RACER }]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(report.reward, JSON.stringify(report.details)).toBe(0);
      expect(report.details?.['leftoverProcesses']).toContain('sh');
    }));
});
