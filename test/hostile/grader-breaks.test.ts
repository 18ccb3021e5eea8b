import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  TaskEnv,
  loadHarborTask,
  loadSweBenchFile,
  loadTasks,
  type SandboxAction,
  type Task,
} from '../../src/env/index.ts';
import { type EpisodeReport } from '../../src/rollout/index.ts';
import { createTestPlatform, playEpisode, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

/*
 * A second attacker's pass at grading (a red team with no view of grader-forgery.test.ts): every
 * case here got reward 1, or a masked episode, before the fixes it names in docs/security.md.
 * Tasks: test/hostile/tasks/*.
 */
const PYTEST_TASK = resolve('test/hostile/tasks/pytest-answer'); // test.sh: `if python3 -m pytest ...; then echo 1`
const ANSWER_TASK = resolve('test/hostile/tasks/answer-file'); // test.sh: `cmp -s /app/answer.txt /tests/expected.txt`
const TB_TASK = resolve('test/hostile/tasks/tb-answer'); // run-tests.sh: python3 -m pytest ... -rA
const TASKS = resolve('test/hostile/tasks');
const SWEBENCH_ROWS = resolve('examples/tasks/calc.swebench.jsonl');
const REDIS_TASK = resolve('test/fixtures/tasks/terminal-bench/compose-redis');

const WRONG = 'def answer():\n    return 41\n';
const write = (content: string, path = '/app/solution.py'): SandboxAction => ({
  type: 'write_file',
  path,
  content,
});
const bash = (command: string): SandboxAction => ({ type: 'exec', command: ['bash', '-c', command] });
/** Prepends Python to the SWE-bench repository's module that the failing test imports. */
const intoOps = (code: string): SandboxAction => ({
  type: 'exec',
  command: [
    'sh',
    '-c',
    `printf '%s' "$0" | cat - /testbed/calc/ops.py > /tmp/ops && cp /tmp/ops /testbed/calc/ops.py`,
    code,
  ],
});

/** An NSS module whose constructor rewrites the staged test scripts; built on the host. */
function nssModule(): string {
  const dir = mkdtempSync(join(tmpdir(), 'nss-'));
  writeFileSync(
    join(dir, 'm.c'),
    `#include <fcntl.h>
#include <string.h>
#include <unistd.h>
static void put(const char *path, const char *text) {
  if (access(path, F_OK) != 0) return;
  int fd = open(path, O_WRONLY | O_TRUNC);
  if (fd < 0) return;
  write(fd, text, strlen(text));
  close(fd);
}
__attribute__((constructor)) static void init(void) {
  put("/tests/test.sh", "#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n");
  put("/tests/run-tests.sh", "#!/bin/bash\\nprintf '=== short test summary info ===\\\\nPASSED test_outputs.py::test_everything\\\\n'\\n");
}
`,
  );
  execFileSync('gcc', ['-shared', '-fPIC', '-O2', '-o', join(dir, 'X.so.2'), join(dir, 'm.c')]);
  return readFileSync(join(dir, 'X.so.2')).toString('base64');
}

/** Every python3 of the grader takes its standard library from the agent's folder, through /usr/pyvenv.cfg. */
const OWN_STDLIB = [
  'set -e',
  'mkdir -p /opt/e/bin /opt/e/lib/python3.11',
  'for f in /usr/lib/python3.11/*; do b=$(basename $f); case $b in __pycache__|unittest) ;; *) ln -s $f /opt/e/lib/python3.11/$b;; esac; done',
  'cp -r /usr/lib/python3.11/unittest /opt/e/lib/python3.11/unittest',
  "printf 'home = /opt/e/bin\\n' > /usr/pyvenv.cfg",
].join('\n');
const PASSING_PYTEST = [
  'cp -r /usr/lib/python3/dist-packages/_pytest /opt/e/lib/python3.11/_pytest',
  "cat >> /opt/e/lib/python3.11/_pytest/reports.py <<'PY'",
  '_fic = TestReport.from_item_and_call.__func__',
  'def _passing(cls, item, call):',
  '    r = _fic(cls, item, call)',
  "    r.outcome, r.longrepr = 'passed', None",
  '    return r',
  'TestReport.from_item_and_call = classmethod(_passing)',
  'PY',
].join('\n');
const PASSING_UNITTEST = [
  "cat >> /opt/e/lib/python3.11/unittest/case.py <<'PY'",
  'def _callTestMethod(self, method):',
  '    try:',
  '        method()',
  '    except AssertionError:',
  '        pass',
  'TestCase._callTestMethod = _callTestMethod',
  'PY',
].join('\n');

describe('graders against a second attacker', () => {
  let env: TestPlatform;
  let nss: string;
  beforeAll(async () => {
    nss = nssModule();
    env = await createTestPlatform('grader-breaks', { privateStore: true, seed: ['debian:bookworm'] });
  });
  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  const harbor = (dir = PYTEST_TASK) => loadHarborTask(dir);
  const tb = async (dir = TB_TASK): Promise<Task> => (await loadTasks([dir]))[0]!;
  const swe = async (): Promise<Task> => (await loadSweBenchFile(SWEBENCH_ROWS))[0]!;
  const play = (task: Task, actions: SandboxAction[] | 'oracle'): Promise<EpisodeReport> =>
    playEpisode(env.platform, task, actions);
  async function expectZero(task: Task, actions: SandboxAction[]): Promise<void> {
    const name = expect.getState().currentTestName ?? 'unnamed';
    await attack('grading-forgery', name.split(' > ').pop() ?? name, async () => {
      const report = await play(task, actions);
      expect(report.outcome, JSON.stringify(report.outcome)).toEqual({ kind: 'ok' });
      expect(report.reward, JSON.stringify(report.details).slice(0, 1500)).toBe(0);
    });
  }
  async function expectOne(task: Task): Promise<void> {
    const report = await play(task, 'oracle');
    expect(report.outcome, JSON.stringify(report.outcome)).toEqual({ kind: 'ok' });
    expect(report.reward, JSON.stringify(report.details).slice(0, 1500)).toBe(1);
  }

  describe("A. pytest's own outcome API from the code under test", () => {
    it('A1 Harbor: pytest.skip() in the function under test', async () =>
      expectZero(await harbor(), [write('import pytest\ndef answer():\n    pytest.skip("later")\n')]));
    it('A2 Harbor: unittest.SkipTest (no pytest import)', async () =>
      expectZero(await harbor(), [
        write('import unittest\ndef answer():\n    raise unittest.SkipTest("later")\n'),
      ]));
    it('A3 Harbor: pytest.xfail()', async () =>
      expectZero(await harbor(), [write('import pytest\ndef answer():\n    pytest.xfail("later")\n')]));
    it('A4 Harbor: pytest.exit(returncode=0) during a test', async () =>
      expectZero(await harbor(), [
        write('import pytest\ndef answer():\n    pytest.exit("bye", returncode=0)\n'),
      ]));
    it('A5 Terminal-Bench: module-level skip at import', async () =>
      expectZero(await tb(), [write('import pytest\npytest.skip("later", allow_module_level=True)\n')]));
    it('A6 Terminal-Bench: forged summary, then pytest.exit(0) (harness has no test, so nothing is checked)', async () =>
      expectZero(await tb(), [
        write(
          "import os, pytest\ndef answer():\n    fd = os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY)\n    os.write(fd, b'=== short test summary info ===\\nPASSED ../tests/test_outputs.py::test_answer\\nPASSED ../tests/test_outputs.py::test_answer_is_an_int\\n')\n    pytest.exit('done', returncode=0)\n",
        ),
      ]));
  });

  describe('B. in-process rewiring the watch list misses', () => {
    const plugin = [
      'import gc, pytest',
      'from _pytest.config import Config',
      'class _Pass:',
      '    @pytest.hookimpl(hookwrapper=True)',
      '    def pytest_runtest_makereport(self, item, call):',
      '        outcome = yield',
      '        report = outcome.get_result()',
      "        report.outcome, report.longrepr = 'passed', None",
      'for _c in [o for o in gc.get_objects() if isinstance(o, Config)]:',
      "    if not _c.pluginmanager.has_plugin('_pass'):",
      "        _c.pluginmanager.register(_Pass(), '_pass')",
      '',
    ].join('\n');
    it('B1 Harbor: a hookwrapper plugin registered at import', async () =>
      expectZero(await harbor(), [write(plugin + WRONG)]));
    it('B2 Terminal-Bench: the same', async () => expectZero(await tb(), [write(plugin + WRONG)]));
    it('B3 SWE-bench runner: unittest.case._Outcome.testPartExecutor replaced', async () =>
      expectZero(await swe(), [
        intoOps(
          'import contextlib, unittest.case as _case\n@contextlib.contextmanager\ndef _swallow(self, test_case, subTest=False):\n    try:\n        yield\n    except Exception:\n        pass\n_case._Outcome.testPartExecutor = _swallow\n',
        ),
      ]));
  });

  describe('C. replacing the runner process (execv keeps the pid, so load/exit records match)', () => {
    it('C1 Harbor: execv into a new pytest on a trivially passing file', async () =>
      expectZero(await harbor(), [
        write('def test_ok():\n    pass\n', '/app/okdir/test_ok.py'),
        write(
          'import os, sys\nos.execv(sys.executable, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "/app/okdir/test_ok.py"])\n',
        ),
      ]));
    it('C2 Terminal-Bench: execv into pytest -rA on same-named fake tests, stdout restored', async () =>
      expectZero(await tb(), [
        write(
          'def test_answer():\n    pass\ndef test_answer_is_an_int():\n    pass\n',
          '/app/fake/test_outputs.py',
        ),
        write(
          "import os, sys\nfor fd in (1, 2):\n    os.dup2(os.open('/proc/%d/fd/%d' % (os.getppid(), fd), os.O_WRONLY), fd)\nos.execv(sys.executable, [sys.executable, '-m', 'pytest', '-rA', '-p', 'no:cacheprovider', '/app/fake/test_outputs.py'])\n",
        ),
      ]));
    it('C3 SWE-bench: execv the runner on a fake repository', async () =>
      expectZero(await swe(), [
        intoOps(
          [
            'import os, sys',
            "if sys.argv[0] == '/sandgym-runner/run_tests.py' and not os.environ.get('X_DONE'):",
            "    os.makedirs('/tmp/fake/tests', exist_ok=True)",
            "    open('/tmp/fake/tests/__init__.py', 'w').close()",
            "    open('/tmp/fake/tests/test_ops.py', 'w').write('import unittest\\nclass OpsTest(unittest.TestCase):\\n    def test_mean(self): pass\\n    def test_add(self): pass\\n')",
            "    os.environ['X_DONE'] = '1'",
            "    os.execv(sys.executable, [sys.executable, '-I', sys.argv[0], '/tmp/fake'] + sys.argv[2:])",
            '',
          ].join('\n'),
        ),
      ]));
  });

  describe('D. start-up hooks the diff filter does not know', () => {
    it('D1 Harbor: /usr/pyvenv.cfg + own stdlib dir holding a patched _pytest', async () =>
      expectZero(await harbor(), [write(WRONG), bash(`${OWN_STDLIB}\n${PASSING_PYTEST}`)]));
    it('D2 Terminal-Bench: the same', async () =>
      expectZero(await tb(), [write(WRONG), bash(`${OWN_STDLIB}\n${PASSING_PYTEST}`)]));
    it('D3 SWE-bench (python3 -I runner): /usr/pyvenv.cfg + patched unittest', async () =>
      expectZero(await swe(), [bash(`${OWN_STDLIB}\n${PASSING_UNITTEST}`)]));
    const plantNss = () =>
      bash(
        `mkdir -p /app/libnss_X && echo ${nss} | base64 -d > /app/libnss_X/X.so.2 && sed -i 's/^passwd:.*/passwd: X\\/X files/' /etc/nsswitch.conf`,
      );
    it('D4 Harbor (bash + cmp only): /etc/nsswitch.conf loads a module from the cwd into bash, which rewrites test.sh', async () =>
      expectZero(await harbor(ANSWER_TASK), [plantNss()]));
    it('D5 Harbor pytest task: the same', async () => expectZero(await harbor(), [write(WRONG), plantNss()]));
    it('D6 Terminal-Bench: the same, rewriting run-tests.sh', async () =>
      expectZero(await tb(), [write(WRONG), plantNss()]));
  });

  // Not here, and written down in docs/security.md as what grading cannot prevent: a partial reward
  // written by the code under test that its tests do not contradict, and code under test that reads
  // the hidden tests while they run. Tools installed on PATH and git's global configuration are
  // never taken from the agent's diff (they would run as the grader's own), so tasks that grade them
  // need the shared verifier mode.
  describe('E. reward files', () => {
    it("E1 Harbor, tests run the agent script: it writes reward.json, which wins over test.sh's reward.txt", async () =>
      expectZero(await harbor(join(TASKS, 'word-count')), [
        write(
          "import json, os\nos.makedirs('/logs/verifier', exist_ok=True)\njson.dump({'reward': 1}, open('/logs/verifier/reward.json', 'w'))\nprint('dunno')\n",
          '/app/wc.py',
        ),
      ]));
  });

  describe('F. hidden files', () => {
    it('F1 a link through a __pycache__ symlink (left out by regex, after the link check) that the grader makes real', async () =>
      expectZero(await harbor(join(TASKS, 'riddle-module')), [
        write('def riddle():\n    return "What has keys but cannot open locks?"\n', '/app/riddle.py'),
        bash(
          'mkdir -p /opt/a/b && ln -s /opt/a/b /app/__pycache__ && ln -s __pycache__/../../tests/expected.txt /app/answer.txt',
        ),
      ]));
  });

  describe('G. masking: verifier_error instead of 0', () => {
    it('G1 a folder with a non-UTF-8 name makes packDiff throw', async () =>
      expectZero(await harbor(), [write(WRONG), bash("mkdir -p /app/$'\\xff\\xfe'/x")]));
    it('G2 a FIFO with a non-UTF-8 name', async () =>
      expectZero(await harbor(), [write(WRONG), bash("mkfifo /app/$'\\xff'")]));
    it('G3 compose service left hanging (CLIENT PAUSE): the control run hangs too', async () =>
      expectZero(await tb(REDIS_TASK), [bash('redis-cli -h cache CLIENT PAUSE 900000 ALL')]));
    it('G4 a hang saved in a disk checkpoint: the control run starts from the checkpoint', async () => {
      const te = TaskEnv.create(env.platform, await harbor());
      try {
        await te.reset();
        await te.step({
          type: 'write_file',
          path: '/app/solution.py',
          content: 'import time\ntime.sleep(3600)\n',
        });
        await te.restore(await te.checkpoint({ depth: 'disk' }));
        const result = await te.step({ type: 'submit' });
        expect(result.outcome, JSON.stringify(result.outcome)).toEqual({ kind: 'ok' });
        expect(result.reward).toBe(0);
      } finally {
        await te.close();
      }
    });
  });

  describe('G. masking: an unresolved starting state blamed on the verifier', () => {
    // the stub does not compile, so run-tests.sh ends before pytest's summary with or without the
    // agent's changes: Terminal-Bench scores that 0, and so must grading, since the oracle passes
    const STUB_TASK = join(TASKS, 'tb-stub-unresolved');
    it('G5 leave the non-compiling stub as it was found', async () => expectZero(await tb(STUB_TASK), []));
    it('G6 write another stub that does not compile either', async () =>
      expectZero(await tb(STUB_TASK), [write('def answer(:\n')]));
    it('G7 the honest twin: the oracle makes it compile and pass', async () =>
      expectOne(await tb(STUB_TASK)));
    it('G8 a verifier that fails its own oracle is still the verifier fault', async () => {
      const task = await tb(STUB_TASK);
      const broken: Task = { ...task, oracle: { kind: 'shell', path: '/tmp/solve.sh', script: 'exit 0\n' } };
      const report = await play(broken, []);
      expect(report.outcome).toMatchObject({
        kind: 'verifier_error',
        message: expect.stringMatching(/without them too .*and so does the task's oracle/) as unknown,
      });
    });
  });

  describe("I. borrowing the task's own habit", () => {
    // the image's helper skips an optional test in every run, so every run is an anomaly of the
    // same kind: a skip of the agent's own must not pass as that habit
    const HABIT_TASK = join(TASKS, 'skip-habit');
    it('I1 skip the real test through the image helper', async () =>
      expectZero(await harbor(HABIT_TASK), [
        write('from testing_helpers import optional\ndef answer():\n    optional("nothing_by_this_name")\n'),
      ]));
    it('I2 skip it with pytest.skip', async () =>
      expectZero(await harbor(HABIT_TASK), [
        write('import pytest\ndef answer():\n    pytest.skip("later")\n'),
      ]));
    it('I3 the honest twin: the oracle scores 1 with the habit', async () =>
      expectOne(await harbor(HABIT_TASK)));
  });

  describe('H. honest agents scored 0 or masked (false positives)', () => {
    it('H1 Terminal-Bench run-tests.sh template (venv in WORKDIR): the guard refuses its pytest', async () =>
      expectOne(await tb(join(TASKS, 'tb-venv'))));
    it('H4 tests that run the agent tests in-process with expected failures (pytest.main)', async () =>
      expectOne(await harbor(join(TASKS, 'mutation-tests'))));
  });
});
