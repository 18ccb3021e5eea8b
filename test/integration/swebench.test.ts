import { execFileSync } from 'node:child_process';
import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadSweBenchFile, type Task } from '../../src/env/index.ts';
import { decisionOf, evaluate, oracleAgent, scriptedAgent } from '../../src/rollout/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const ROWS = resolve('examples/tasks/calc.swebench.jsonl');
const FIX_COMMIT = 'b191cdd';

describe('SWE-bench tasks', () => {
  let env: TestPlatform;
  let task: Task;

  beforeAll(async () => {
    env = await createTestPlatform('swebench', { privateStore: true, seed: ['debian:bookworm'] });
    [task] = (await loadSweBenchFile(ROWS)) as [Task];
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('checks the repository out at the base commit with every later commit scrubbed', async () => {
    await using taskEnv = TaskEnv.create(env.platform, task);
    await taskEnv.reset();
    const git = async (...args: string[]): Promise<string> =>
      (await taskEnv.sandbox!.exec(['git', '-C', '/testbed', ...args])).stdout.trim();
    expect(await git('log', '--all', '--format=%s')).toBe('calc: add and mean');
    expect(await git('tag')).toBe('');
    expect(await git('branch', '-a', '--format=%(refname)')).toBe('refs/heads/main');
    expect(await git('remote')).toBe('');
    const hidden = await taskEnv.sandbox!.exec(['git', '-C', '/testbed', 'cat-file', '-e', FIX_COMMIT]);
    expect(hidden.exitCode).not.toBe(0);
  });

  it('resolves with the reference patch and reports each test', async () => {
    const [report] = await evaluate(env.platform, [task], oracleAgent, { concurrency: 1 });
    expect(report).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
  });

  it('resets the test folder and ignores a planted unittest, so rewriting tests earns nothing', async () => {
    const cheat = scriptedAgent([
      {
        type: 'write_file',
        path: '/testbed/tests/test_ops.py',
        content:
          'import unittest\n\nclass OpsTest(unittest.TestCase):\n    def test_add(self): pass\n    def test_mean(self): pass\n',
      },
      {
        type: 'write_file',
        path: '/testbed/tests/__init__.py',
        content: 'import unittest\nunittest.TestCase.run = lambda self, result=None: None\n',
      },
      { type: 'write_file', path: '/testbed/unittest.py', content: 'raise SystemExit(0)\n' },
    ]);
    await using taskEnv = TaskEnv.create(env.platform, task);
    const { info } = await taskEnv.reset();
    for (let i = 0; i < 3; i++) {
      const { action } = decisionOf(
        await cheat({ type: 'submitted' }, { task, episodeId: info.episodeId, stepIndex: i }),
      );
      await taskEnv.step(action);
    }
    const grade = await taskEnv.grade();
    expect(grade.reward).toBe(0);
    expect(grade.details).toMatchObject({
      resolved: false,
      failToPass: { 'tests.test_ops.OpsTest.test_mean': 'failed' },
      passToPass: { 'tests.test_ops.OpsTest.test_add': 'passed' },
    });
  });

  it('fails a test id that does not exist instead of counting it as passed', async () => {
    const rows = join(env.dataDir, 'missing.swebench.jsonl');
    const row = JSON.parse((await readFile(ROWS, 'utf8')).trim()) as Record<string, unknown>;
    await writeFile(
      rows,
      `${JSON.stringify({ ...row, repo: await besideRows(), FAIL_TO_PASS: ['tests.test_ops.OpsTest.test_nope'] })}\n`,
    );
    const [missing] = await loadSweBenchFile(rows);
    await using taskEnv = TaskEnv.create(env.platform, missing!);
    await taskEnv.reset();
    await taskEnv.step({
      type: 'exec',
      command: "sed -i 's/(len(values) + 1)/len(values)/' /testbed/calc/ops.py",
    });
    const grade = await taskEnv.grade();
    expect(grade.reward).toBe(0);
    expect(grade.details['failToPass']).toEqual({ 'tests.test_ops.OpsTest.test_nope': 'missing' });
  });

  /** The example's bundle beside rows written to the data folder: rows name repositories inside their own folder. */
  async function besideRows(): Promise<string> {
    await copyFile(resolve('examples/tasks/swe/calc.bundle'), join(env.dataDir, 'calc.bundle'));
    return 'calc.bundle';
  }

  /** The example row, with its tests named as pytest node ids. */
  async function pytestTask(): Promise<Task> {
    const rows = join(env.dataDir, `pytest-${Math.random().toString(36).slice(2, 8)}.swebench.jsonl`);
    const row = JSON.parse((await readFile(ROWS, 'utf8')).trim()) as Record<string, unknown>;
    await writeFile(
      rows,
      `${JSON.stringify({
        ...row,
        repo: await besideRows(),
        FAIL_TO_PASS: ['tests/test_ops.py::OpsTest::test_mean'],
        PASS_TO_PASS: ['tests/test_ops.py::OpsTest::test_add'],
      })}\n`,
    );
    const [loaded] = await loadSweBenchFile(rows);
    return loaded!;
  }

  it('runs tests named as pytest node ids', async () => {
    const pytest = await pytestTask();
    const [solved] = await evaluate(env.platform, [pytest], oracleAgent, { concurrency: 1 });
    expect(solved).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
    await using taskEnv = TaskEnv.create(env.platform, pytest);
    await taskEnv.reset();
    const grade = await taskEnv.grade();
    expect(grade.reward).toBe(0);
    expect(grade.details).toMatchObject({
      failToPass: { 'tests/test_ops.py::OpsTest::test_mean': 'failed' },
      passToPass: { 'tests/test_ops.py::OpsTest::test_add': 'passed' },
    });
  });

  it('puts planted or edited pytest harness files back, so a conftest.py that forces passes earns nothing', async () => {
    await using taskEnv = TaskEnv.create(env.platform, await pytestTask());
    await taskEnv.reset();
    await taskEnv.step({
      type: 'write_file',
      path: '/testbed/conftest.py',
      content: [
        'import pytest',
        '@pytest.hookimpl(hookwrapper=True)',
        'def pytest_runtest_makereport(item, call):',
        '    outcome = yield',
        "    outcome.get_result().outcome = 'passed'",
        '',
      ].join('\n'),
    });
    await taskEnv.step({
      type: 'write_file',
      path: '/testbed/pytest.ini',
      content: '[pytest]\naddopts = -q\n',
    });
    const grade = await taskEnv.grade();
    expect(grade.reward).toBe(0);
    expect(grade.details).toMatchObject({
      failToPass: { 'tests/test_ops.py::OpsTest::test_mean': 'failed' },
      restoredHarnessFiles: ['conftest.py', 'pytest.ini'],
    });
  });

  it('voids a run whose code under test rewires the test machinery or ends the runner', async () => {
    const cheats: Record<string, string> = {
      // every assertEqual passes: the failing test would look fixed
      rewire: 'import unittest\nunittest.TestCase.assertEqual = lambda self, a, b, msg=None: None\n',
      // the runner dies before its report: nothing would be counted against the agent
      exit: 'import os\nos._exit(0)\n',
    };
    for (const [name, prelude] of Object.entries(cheats)) {
      await using taskEnv = TaskEnv.create(env.platform, task);
      await taskEnv.reset();
      const source = (await taskEnv.sandbox!.readFile('/testbed/calc/ops.py')).toString();
      await taskEnv.step({ type: 'write_file', path: '/testbed/calc/ops.py', content: prelude + source });
      const grade = await taskEnv.grade();
      expect(grade.reward, name).toBe(0);
      if (name === 'rewire') expect(grade.details['harnessTampered']).toEqual(['TestCase.assertEqual']);
      else expect(grade.details['anomaly']).toMatch(/ended without finishing|did not finish/);
    }
  });

  it('grades plain pytest function ids: pytest flagging its own classes is no tampering', async () => {
    // a repository whose tests are module-level functions, as most pytest projects write them
    const repo = join(env.dataDir, 'pyfuncs');
    const git = (...args: string[]): string =>
      execFileSync('git', ['-C', repo, '-c', 'user.name=t', '-c', 'user.email=t@t', ...args], {
        encoding: 'utf8',
      }).trim();
    await mkdir(join(repo, 'tests'), { recursive: true });
    execFileSync('git', ['init', '-q', '-b', 'main', repo]);
    await writeFile(join(repo, 'calc.py'), 'def half(x):\n    return x // 2\n');
    await writeFile(join(repo, 'tests', '__init__.py'), '');
    await writeFile(
      join(repo, 'tests', 'test_calc.py'),
      'from calc import half\n\n\ndef test_even():\n    assert half(4) == 2\n',
    );
    git('add', '.');
    git('commit', '-q', '-m', 'base');
    const base = git('rev-parse', 'HEAD');
    const patch =
      'diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def half(x):\n-    return x // 2\n+    return x / 2\n';
    const testPatch =
      'diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -3,3 +3,7 @@ from calc import half\n \n def test_even():\n     assert half(4) == 2\n+\n+\n+def test_odd():\n+    assert half(3) == 1.5\n';
    const rows = join(env.dataDir, 'pyfuncs.swebench.jsonl');
    await writeFile(
      rows,
      `${JSON.stringify({
        instance_id: 'pyfuncs__half-1',
        repo: 'pyfuncs', // beside the rows
        base_commit: base,
        patch,
        test_patch: testPatch,
        problem_statement: 'half(3) should be 1.5',
        FAIL_TO_PASS: ['tests/test_calc.py::test_odd'],
        PASS_TO_PASS: ['tests/test_calc.py::test_even'],
      })}\n`,
    );
    const tasks = await loadSweBenchFile(rows);
    const [oracle] = await evaluate(env.platform, tasks, oracleAgent, { concurrency: 1 });
    expect(oracle, JSON.stringify(oracle?.details)).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
    const [nop] = await evaluate(env.platform, tasks, () => scriptedAgent([]), { concurrency: 1 });
    expect(nop?.reward).toBe(0);
    expect(nop?.details).toMatchObject({ failToPass: { 'tests/test_calc.py::test_odd': 'failed' } });
  });

  it('names the line and field of a malformed row', async () => {
    const rows = join(env.dataDir, 'bad.swebench.jsonl');
    const row = JSON.parse((await readFile(ROWS, 'utf8')).trim()) as Record<string, unknown>;
    await writeFile(rows, `\n${JSON.stringify({ ...row, FAIL_TO_PASS: 'not json' })}\n`);
    await expect(loadSweBenchFile(rows)).rejects.toThrow(
      /bad\.swebench\.jsonl line 2: FAIL_TO_PASS: must be a JSON array of test ids/,
    );
  });
});
