import { z } from 'zod';
import { SandgymError } from '../common/index.ts';
import type { PlatformClient, Sandbox } from '../platform/index.ts';
import type { OjCase, Task, TaskGrading } from './tasks/task.ts';
import { stageFolder } from './stage-folder.ts';

/** What a verifier works with: the grading sandbox (task layers plus the agent's diff). */
export interface VerifyContext {
  task: Task;
  grader: Sandbox;
  workdir: string;
  /** The platform, for verifiers that run calls of their own (OJ judges through FnCall). */
  platform: PlatformClient;
  /** The clean environment the grader was built on, without the agent's changes. */
  environment: string;
}

/** A verifier's verdict: the reward and what led to it. */
export interface VerifierResult {
  reward: number;
  details: Record<string, unknown>;
}

/** An interceptor: it may decide, or call `next` and adjust what the rest decided. */
export type Verifier = (
  context: VerifyContext,
  next: () => Promise<VerifierResult>,
) => Promise<VerifierResult>;

/** Runs the chain in order; the last verifier's `next` fails, since no one decided. */
export function runVerifiers(
  verifiers: readonly Verifier[],
  context: VerifyContext,
): Promise<VerifierResult> {
  const at = (index: number): Promise<VerifierResult> => {
    const verifier = verifiers[index];
    if (!verifier)
      return Promise.reject(
        new SandgymError('failed_precondition', `No verifier decided a reward for task ${context.task.id}`),
      );
    return verifier(context, () => at(index + 1));
  };
  return at(0);
}

function parseReward(text: string, json: boolean): number {
  if (!json) {
    const value = Number(text.trim());
    if (!Number.isFinite(value))
      throw new SandgymError('invalid_argument', `reward.txt holds "${text.trim()}", not a number`);
    return value;
  }
  const parsed = JSON.parse(text) as Record<string, unknown>;
  if (typeof parsed['reward'] === 'number') return parsed['reward'];
  const values = Object.values(parsed).filter((v): v is number => typeof v === 'number');
  if (values.length === 0) throw new SandgymError('invalid_argument', 'reward.json holds no number');
  return values.reduce((a, b) => a + b, 0) / values.length;
}

/**
 * Harbor: stages the task's tests at /tests (in the grader only), creates /logs/verifier empty,
 * runs /tests/test.sh, and reads reward.txt or reward.json over the agent channel.
 */
export function rewardFileVerifier(testsDir: string, timeoutMs: number): Verifier {
  return async ({ grader, workdir }) => {
    await stageFolder(grader, testsDir, '/tests');
    await grader.exec(['mkdir', '-p', '/logs/verifier']);
    const run = await grader.exec(['/tests/test.sh'], { timeoutMs, cwd: workdir });
    if (run.timedOut) throw new SandgymError('timeout', `The verifier ran out of its ${timeoutMs} ms`);
    const files = (await grader.listDir('/logs/verifier')).map((e) => e.name);
    const json = files.includes('reward.json');
    const reward =
      files.includes('reward.txt') || json
        ? parseReward(
            (
              await grader.readFile(json ? '/logs/verifier/reward.json' : '/logs/verifier/reward.txt')
            ).toString(),
            json,
          )
        : 0;
    return {
      reward,
      details: {
        exitCode: run.exitCode,
        output: `${run.stdout}${run.stderr}`.slice(-4000),
        rewardFile: files.includes('reward.txt') || json,
      },
    };
  };
}

/** Reward 1 when a command exits 0 in the grader, else 0. */
export function exitCodeVerifier(argv: string[], timeoutMs: number): Verifier {
  return async ({ grader, workdir }) => {
    const run = await grader.exec(argv, { timeoutMs, cwd: workdir });
    if (run.timedOut)
      throw new SandgymError('timeout', `The verifier command ran out of its ${timeoutMs} ms`);
    return { reward: run.exitCode === 0 ? 1 : 0, details: { exitCode: run.exitCode } };
  };
}

/** Output as judges compare it: trailing spaces on each line and trailing blank lines ignored. */
export function normaliseOutput(text: string): string {
  return text
    .split('\n')
    .map((line) => line.replace(/\s+$/, ''))
    .join('\n')
    .replace(/\n+$/, '');
}

/**
 * OJ: takes the agent's program from the grader, then judges each case as a stateless FnCall in a
 * warm sandbox of the clean environment (so nothing the agent changed besides its program takes
 * part), with the case's stdin and time limit and the task's memory limit. Reward 1 only when
 * every case matches.
 */
export function ojVerifier(program: string, run: string[], cases: OjCase[], caseTimeoutMs: number): Verifier {
  return async ({ grader, workdir, platform, environment, task }) => {
    const source = await grader.readFile(program).catch(() => undefined);
    if (!source)
      return { reward: 0, details: { cases: cases.map(() => 'no_program'), passed: 0, total: cases.length } };
    const judge = await platform.createSandbox({
      backend: 'fncall',
      environment,
      resources: { cpu: task.resources.cpu, memoryMib: task.resources.memoryMib },
    });
    try {
      await judge.writeFile(program, source, { mode: 0o755 });
      const statuses: string[] = [];
      for (const testCase of cases) {
        const result = await judge.exec(run, {
          stdin: testCase.stdin,
          timeoutMs: caseTimeoutMs,
          cwd: workdir,
        });
        statuses.push(
          result.timedOut
            ? 'time_limit'
            : result.oomKilled
              ? 'memory_limit'
              : result.exitCode !== 0
                ? 'runtime_error'
                : normaliseOutput(result.stdout) === normaliseOutput(testCase.stdout)
                  ? 'accepted'
                  : 'wrong_answer',
        );
      }
      const passed = statuses.filter((s) => s === 'accepted').length;
      return {
        reward: passed === cases.length ? 1 : 0,
        details: { cases: statuses, passed, total: cases.length, judgedBy: 'fncall' },
      };
    } finally {
      await judge.close();
    }
  };
}

/**
 * The test runner staged into the grader for SWE-bench tasks. Ids are unittest names
 * (`tests.test_ops.OpsTest.test_mean`) or pytest node ids (`tests/test_ops.py::test_mean[1]`).
 * Python runs isolated (-I: no current folder, script folder or PYTHON* variables on the path),
 * and unittest and pytest are imported before the repository joins the path, so a planted
 * unittest.py or pytest.py cannot stand in for them. Every requested id gets an explicit status
 * in a JSON report; a missing id counts as failed.
 */
const SWEBENCH_RUNNER = `import json, sys, unittest
repo, report, ids = sys.argv[1], sys.argv[2], sys.argv[3:]
node_ids = [i for i in ids if '::' in i or i.endswith('.py')]
statuses = {}
dump, write_to = json.dump, open  # kept before any code under test runs

class UnittestRecorder(unittest.TestResult):
    def addSuccess(self, test): statuses[test.id()] = 'passed'
    def addFailure(self, test, err): statuses[test.id()] = 'failed'
    def addError(self, test, err): statuses[test.id()] = 'error'
    def addSkip(self, test, reason): statuses[test.id()] = 'skipped'
    def addExpectedFailure(self, test, err): statuses[test.id()] = 'failed'
    def addUnexpectedSuccess(self, test): statuses[test.id()] = 'failed'

class PytestRecorder:
    def pytest_runtest_logreport(self, report):
        if report.when == 'call':
            statuses[report.nodeid] = report.outcome
        elif report.failed:
            statuses[report.nodeid] = 'error'
        elif report.skipped and report.when == 'setup':
            statuses[report.nodeid] = 'skipped'

# The code under test runs in this process: if it rewires the test machinery, no status counts.
watched = [unittest.TestCase, unittest.TestResult, unittest.TestSuite, unittest.TestLoader,
           UnittestRecorder, PytestRecorder, json]
if node_ids:
    import pytest, _pytest.runner, _pytest.python, _pytest.reports
    watched += [_pytest.runner, _pytest.python.Function, _pytest.reports.TestReport, pytest]
before = [(holder, dict(vars(holder))) for holder in watched]

if node_ids:
    pytest.main(['-q', '-p', 'no:cacheprovider', '--rootdir', repo, *node_ids], plugins=[PytestRecorder()])
sys.path.insert(0, repo)
for test_id in [i for i in ids if i not in node_ids]:
    try:
        unittest.defaultTestLoader.loadTestsFromName(test_id).run(UnittestRecorder())
    except Exception:
        statuses[test_id] = 'error'

tampered = sorted(
    f'{getattr(holder, "__name__", holder)}.{name}'
    for holder, saved in before
    for name, value in vars(holder).items()
    if name in saved and saved[name] is not value
    or name not in saved and isinstance(holder, type)
)
if tampered:
    statuses = {test_id: 'error' for test_id in ids}
with write_to(report, 'w') as out:
    dump({'complete': True, 'statuses': statuses, 'harnessTampered': tampered}, out)
`;

const runnerReportSchema = z.object({
  complete: z.literal(true),
  statuses: z.record(z.string(), z.string()),
  harnessTampered: z.array(z.string()),
});

/** The runner's report, or undefined when it never wrote a whole one. */
async function runnerReport(grader: Sandbox): Promise<z.infer<typeof runnerReportSchema> | undefined> {
  try {
    return runnerReportSchema.parse(
      JSON.parse((await grader.readFile('/logs/verifier/report.json')).toString()),
    );
  } catch {
    return undefined;
  }
}

/**
 * Files that steer how tests run and that an agent could plant or edit to make them pass: every
 * conftest.py, and pytest's configuration at the repository root. The grader puts them back as
 * they were at the base commit.
 */
const TEST_HARNESS_FILES = /(^|\/)conftest\.py$|^(pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml)$/;

/** Restores the test harness files of `repo` to the base commit; returns the ones it changed. */
async function restoreTestHarness(grader: Sandbox, repo: string, baseCommit: string): Promise<string[]> {
  const git = (...args: string[]) => grader.exec(['git', '-C', repo, ...args]);
  const lines = (text: string): string[] => text.split('\n').filter(Boolean);
  const untracked = lines((await git('ls-files', '--others')).stdout).filter((f) =>
    TEST_HARNESS_FILES.test(f),
  );
  const changed = lines((await git('diff', '--name-only', baseCommit)).stdout).filter((f) =>
    TEST_HARNESS_FILES.test(f),
  );
  for (const file of untracked) await grader.exec(['rm', '-f', '--', `${repo}/${file}`]);
  for (const file of changed) {
    const existed = (await git('cat-file', '-e', `${baseCommit}:${file}`)).exitCode === 0;
    if (existed) await git('checkout', '-q', baseCommit, '--', file);
    else await grader.exec(['rm', '-f', '--', `${repo}/${file}`]);
  }
  return [...untracked, ...changed];
}

/** Files a unified diff touches (its "a/" side), for resetting them before the test patch goes in. */
function patchedFiles(patch: string): string[] {
  return [...patch.matchAll(/^diff --git a\/(\S+) b\//gm)].map((m) => m[1] ?? '').filter(Boolean);
}

/**
 * SWE-bench: the folders of the test patch's files are reset to the base commit (edits and
 * planted files such as a conftest.py go), the test patch is applied, the FAIL_TO_PASS and
 * PASS_TO_PASS tests run, and the reward is 1 only when every one of them passed.
 */
export function sweBenchVerifier(
  grading: Extract<TaskGrading, { kind: 'swebench' }>,
  timeoutMs: number,
): Verifier {
  return async ({ grader }) => {
    const repo = grading.repoPath;
    const dirs = [
      ...new Set(
        patchedFiles(grading.testPatch).map((file) => file.split('/').slice(0, -1).join('/') || '.'),
      ),
    ];
    for (const dir of dirs) {
      await grader.exec(['git', '-C', repo, 'checkout', '-q', grading.baseCommit, '--', dir]);
      await grader.exec(['git', '-C', repo, 'clean', '-fdxq', '--', dir]);
    }
    const restored = await restoreTestHarness(grader, repo, grading.baseCommit);
    await grader.writeFile('/tmp/sandgym-test.patch', grading.testPatch);
    const applied = await grader.exec(['git', '-C', repo, 'apply', '/tmp/sandgym-test.patch']);
    if (applied.exitCode !== 0)
      throw new SandgymError(
        'failed_precondition',
        `The test patch does not apply: ${applied.stderr.trim()}`,
      );
    await grader.writeFile('/sandgym-runner/run_tests.py', SWEBENCH_RUNNER);
    await grader.exec(['mkdir', '-p', '/logs/verifier']);
    const ids = [...grading.failToPass, ...grading.passToPass];
    const run = await grader.exec(
      ['python3', '-I', '/sandgym-runner/run_tests.py', repo, '/logs/verifier/report.json', ...ids],
      {
        timeoutMs,
        cwd: repo,
      },
    );
    if (run.timedOut) throw new SandgymError('timeout', `The tests ran out of their ${timeoutMs} ms`);
    const report = await runnerReport(grader);
    // the runner always finishes and says so: if it did not, the code under test ended it
    if (!report || run.exitCode !== 0) {
      return {
        reward: 0,
        details: {
          resolved: false,
          runner: `did not finish (exit ${run.exitCode ?? run.signal})`,
          restoredHarnessFiles: restored,
        },
      };
    }
    const status = (id: string): string => report.statuses[id] ?? 'missing';
    const failToPass = Object.fromEntries(grading.failToPass.map((id) => [id, status(id)]));
    const passToPass = Object.fromEntries(grading.passToPass.map((id) => [id, status(id)]));
    const resolved = ids.every((id) => status(id) === 'passed');
    return {
      reward: resolved ? 1 : 0,
      details: {
        resolved,
        failToPass,
        passToPass,
        ...(restored.length ? { restoredHarnessFiles: restored } : {}),
        ...(report.harnessTampered.length ? { harnessTampered: report.harnessTampered } : {}),
      },
    };
  };
}

/** A verifier from a plain function of the context. */
export function customVerifier(decide: (context: VerifyContext) => Promise<VerifierResult>): Verifier {
  return (context) => decide(context);
}

/** The verifier a task's format calls for. */
export function defaultVerifier(task: Task): Verifier {
  const grading = task.grading;
  switch (grading.kind) {
    case 'reward_file':
      return rewardFileVerifier(grading.testsDir, task.verifierTimeoutMs);
    case 'oj':
      return ojVerifier(grading.program, grading.run, grading.cases, grading.caseTimeoutMs);
    case 'swebench':
      return sweBenchVerifier(grading, task.verifierTimeoutMs);
  }
}
