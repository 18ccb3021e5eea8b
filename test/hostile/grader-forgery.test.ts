import { resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  loadHarborTask,
  loadSweBenchFile,
  loadTasks,
  type SandboxAction,
  type Task,
} from '../../src/env/index.ts';
import { evaluate, oracleAgent, type EpisodeReport } from '../../src/rollout/index.ts';
import { createTestPlatform, playEpisode, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const PYTEST_TASK = resolve('test/hostile/tasks/pytest-answer');
const ANSWER_TASK = resolve('test/hostile/tasks/answer-file');
const TB_TASK = resolve('test/hostile/tasks/tb-answer');
const SWEBENCH_ROWS = resolve('examples/tasks/calc.swebench.jsonl');

const REWARD = '/logs/verifier/reward.txt';
/** Python that forges the reward file, as the code under test can from inside the tests. */
const FORGE_REWARD = `import os\nos.makedirs('/logs/verifier', exist_ok=True)\nopen('${REWARD}', 'w').write('1')\n`;
/** A wrong answer: what each attack's code under test really computes. */
const WRONG_ANSWER = 'def answer():\n    return 41\n';
/** pytest's summary as a naive parser takes it, every test of tb-answer passing. */
const FORGED_SUMMARY =
  '=========================== short test summary info ============================\\n' +
  'PASSED ../tests/test_outputs.py::test_answer\\nPASSED ../tests/test_outputs.py::test_answer_is_an_int\\n' +
  '============================== 2 passed in 0.01s ===============================\\n';

/** The Terminal-Bench fixture, loaded the way `sandgym eval` loads a folder. */
async function tbTask(): Promise<Task> {
  const [task] = await loadTasks([TB_TASK]);
  if (!task) throw new Error(`no task in ${TB_TASK}`);
  return task;
}

function writeSolution(content: string, path = '/app/solution.py'): SandboxAction {
  return { type: 'write_file', path, content };
}

/**
 * The code under test attacking the grader from inside the test run: modules that stand in for
 * the harness's, output and rewards forged before the runner is killed or exits early, pytest's
 * own machinery rewired, a daemon that rewrites the reward after the tests, links from the
 * agent's files to the hidden ones, and the SWE-bench runner's report rewired. Each must score 0
 * (never a pass, never a masked episode); the honest twins must still score 1.
 */
describe('graders under attack from the code they run', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-grader-forgery', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  const play = (task: Task, actions: SandboxAction[]): Promise<EpisodeReport> =>
    playEpisode(env.platform, task, actions);

  async function expectNoReward(task: Task, actions: SandboxAction[]): Promise<EpisodeReport> {
    const report = await play(task, actions);
    expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
    expect(report.reward, JSON.stringify(report.details)).toBe(0);
    return report;
  }

  async function expectOracleSolves(task: Task): Promise<void> {
    const [report] = await evaluate(env.platform, [task], oracleAgent, { concurrency: 1 });
    expect(report?.reward, JSON.stringify(report?.details)).toBe(1);
    expect(report?.outcome).toEqual({ kind: 'ok' });
  }

  describe('harness shadowing: modules in the workdir that `python -m pytest` finds first', () => {
    const forgeAndExit = `${FORGE_REWARD}os._exit(0)\n`;
    const shadows: Record<string, SandboxAction[]> = {
      'pytest.py': [writeSolution(forgeAndExit, '/app/pytest.py')],
      'pytest package': [
        writeSolution('', '/app/pytest/__init__.py'),
        writeSolution(forgeAndExit, '/app/pytest/__main__.py'),
      ],
      '_pytest package': [writeSolution(forgeAndExit, '/app/_pytest/__init__.py')],
      'pluggy.py': [writeSolution(forgeAndExit, '/app/pluggy.py')],
      'argparse.py (standard library)': [writeSolution(forgeAndExit, '/app/argparse.py')],
    };
    for (const [name, actions] of Object.entries(shadows)) {
      it(`never runs a planted ${name} in the harness`, () =>
        attack('grading-forgery', `shadow ${name}`, async () => {
          await expectNoReward(await loadHarborTask(PYTEST_TASK), [writeSolution(WRONG_ANSWER), ...actions]);
        }));
    }

    it('reports a planted harness module as tampering, and still grades the real work', async () => {
      const task = await loadHarborTask(PYTEST_TASK);
      const report = await play(task, [
        writeSolution('def answer():\n    return 42\n'),
        writeSolution(forgeAndExit, '/app/pytest.py'),
      ]);
      expect(report.reward).toBe(1);
      expect(report.tampered).toContain('/app/pytest.py');
    });
  });

  describe('forged results from inside the test run', () => {
    it('scores a reward file written by the code under test, then test.sh killed, 0', () =>
      attack('grading-forgery', 'reward then kill test.sh', async () => {
        const kill = `${FORGE_REWARD}import signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)\n`;
        const report = await expectNoReward(await loadHarborTask(PYTEST_TASK), [
          writeSolution(kill + WRONG_ANSWER),
        ]);
        expect(String(report.details?.['anomaly'])).toMatch(/killed by SIGKILL|ended without finishing/);
      }));

    it('scores pytest ending with os._exit(0) at import, so `if pytest; then echo 1` passes, 0', () =>
      attack('grading-forgery', 'os._exit(0) at import', async () => {
        const report = await expectNoReward(await loadHarborTask(PYTEST_TASK), [
          writeSolution(`import os\nos._exit(0)\n${WRONG_ANSWER}`),
        ]);
        expect(String(report.details?.['anomaly'])).toMatch(/ended without finishing/);
      }));

    it('scores a daemon of the code under test that rewrites the reward after the tests, 0', () =>
      attack('grading-forgery', 'reward-rewriting daemon', async () => {
        const daemon = [
          'import os, time',
          'if os.fork() == 0:',
          '    os.setsid()',
          '    if os.fork() == 0:',
          '        end = time.time() + 20',
          '        while time.time() < end:',
          '            try:',
          // whole or not at all, so the grader never reads it half written
          "                open('/logs/verifier/.r', 'w').write('1')",
          `                os.replace('/logs/verifier/.r', '${REWARD}')`,
          '            except OSError:',
          '                pass',
          '    os._exit(0)',
          '',
        ].join('\n');
        await expectNoReward(await loadHarborTask(PYTEST_TASK), [writeSolution(daemon + WRONG_ANSWER)]);
      }));

    it("scores PASSED lines written into the runner's output before pytest is killed, 0", () =>
      attack('grading-forgery', 'forged summary then kill pytest', async () => {
        const forge = [
          'import os, signal',
          `os.write(os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY), b'${FORGED_SUMMARY}')`,
          'os.kill(os.getpid(), signal.SIGKILL)',
          '',
        ].join('\n');
        await expectNoReward(await tbTask(), [writeSolution(forge + WRONG_ANSWER)]);
      }));

    it("scores PASSED lines written into the runner's output before os._exit(0), 0", () =>
      attack('grading-forgery', 'forged summary then os._exit', async () => {
        const forge = [
          'import os',
          `os.write(os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY), b'${FORGED_SUMMARY}')`,
          'os._exit(0)',
          '',
        ].join('\n');
        await expectNoReward(await tbTask(), [writeSolution(forge + WRONG_ANSWER)]);
      }));

    it("scores code under test that rewires pytest's reports to say passed, 0", () =>
      attack('grading-forgery', 'rewired pytest reports', async () => {
        const rewire = [
          'import _pytest.reports as reports',
          '_init = reports.TestReport.__init__',
          'def _passing(self, *args, **kwargs):',
          '    _init(self, *args, **kwargs)',
          "    if self.when == 'call':",
          "        self.outcome, self.longrepr = 'passed', None",
          'reports.TestReport.__init__ = _passing',
          '',
        ].join('\n');
        await expectNoReward(await tbTask(), [writeSolution(rewire + WRONG_ANSWER)]);
      }));

    it('still solves the Terminal-Bench task whose tests import the agent module (honest twin)', async () => {
      await expectOracleSolves(await tbTask());
      const report = await play(await tbTask(), [
        writeSolution('import os\n\ndef answer():\n    return 42\n'),
      ]);
      expect(report.reward, JSON.stringify(report.details)).toBe(1);
    });
  });

  describe('SWE-bench runner: the code under test rewires how results are written', () => {
    const preludes: Record<string, string> = {
      "rebinds the runner's report writer": [
        'import __main__',
        "_dump = getattr(__main__, 'dump', None)",
        'if _dump:',
        "    __main__.dump = lambda report, out: _dump(dict(report, statuses={i: 'passed' for i in __main__.ids}), out)",
        '',
      ].join('\n'),
      "rebinds sandgym's reporter": [
        'import sys',
        "_reporter = sys.modules.get('sandgym_pytest_report')",
        'if _reporter:',
        '    _report = _reporter.report_test',
        "    _reporter.report_test = lambda test, outcome: _report(test, 'passed')",
        '',
      ].join('\n'),
      'rewrites every write to say passed': [
        'import os',
        '_write = os.write',
        'os.write = lambda fd, data: _write(fd, data.replace(b\'"failed"\', b\'"passed"\'))',
        '',
      ].join('\n'),
    };
    for (const [name, prelude] of Object.entries(preludes)) {
      it(`scores code under test that ${name} 0`, () =>
        attack('grading-forgery', `swebench ${name}`, async () => {
          const [task] = (await loadSweBenchFile(SWEBENCH_ROWS)) as [Task];
          // the module the failing test imports: its prelude runs inside the runner
          await expectNoReward(task, [
            {
              type: 'exec',
              command: [
                'sh',
                '-c',
                `printf '%s' "$0" | cat - /testbed/calc/ops.py > /tmp/ops && cp /tmp/ops /testbed/calc/ops.py`,
                prelude,
              ],
            },
          ]);
        }));
    }
  });

  describe('links from the agent into hidden files', () => {
    const links: Record<string, string> = {
      absolute: 'ln -s /tests/expected.txt /app/answer.txt',
      relative: 'ln -s ../tests/expected.txt /app/answer.txt',
      'through a linked folder': 'ln -s /tests /app/t && ln -s t/expected.txt /app/answer.txt',
      'through a link to the root': 'ln -s / /opt/root && ln -s /opt/root/tests/expected.txt /app/answer.txt',
      'through /proc/self/root': 'ln -s /proc/self/root/tests/expected.txt /app/answer.txt',
      'through dot-dot past the root': 'ln -s /app/../../../tests/expected.txt /app/answer.txt',
    };
    for (const [name, command] of Object.entries(links)) {
      it(`drops a link ${name} into the hidden tests, and reports it`, () =>
        attack('grading-forgery', `hidden link ${name}`, async () => {
          const report = await expectNoReward(await loadHarborTask(ANSWER_TASK), [{ type: 'exec', command }]);
          const dropped = (report.details?.['droppedFromDiff'] ?? []) as { path: string; reason: string }[];
          expect(dropped.map((entry) => entry.reason)).toContain('links_into_hidden');
        }));
    }

    it("keeps the agent's own files and links to them (honest twins)", async () => {
      const task = await loadHarborTask(ANSWER_TASK);
      await expectOracleSolves(task);
      const linked = await play(task, [
        { type: 'exec', command: "echo 'a piano' > /app/real.txt && ln -s /app/real.txt /app/answer.txt" },
      ]);
      expect(linked.reward, JSON.stringify(linked.details)).toBe(1);
    });
  });
});
