import { readFile } from 'node:fs/promises';
import { z } from 'zod';
import { SandgymError } from '../common/index.ts';
import type { PlatformClient, Sandbox } from '../platform/index.ts';
import type { Deadline } from './deadline.ts';
import type { OjCase, Task, TaskGrading } from './tasks/task.ts';
import { parsePytestSummary } from './pytest-summary.ts';
import { parseDjangoLog, parseSympyLog } from './repo-test-logs.ts';
import type { RepoTestRunner } from './tasks/swebench-repos.ts';
import { stageFolder } from './stage-folder.ts';
import { TERMINAL_BENCH_TEST_DIR as TESTS_DIR } from './tasks/terminal-bench.ts';

/** What a verifier works with: the grading sandbox (task layers plus the agent's diff). */
export interface VerifyContext {
  task: Task;
  grader: Sandbox;
  workdir: string;
  /** The platform, for verifiers that run calls of their own (OJ judges through FnCall). */
  platform: PlatformClient;
  /** The clean environment the grader was built on, without the agent's changes. */
  environment: string;
  /** What is left of the grading's time: every call in the grader takes its timeout from it. */
  deadline: Deadline;
  /**
   * The user the task's tests run as (its verifier user, else its image's USER); absent: root.
   * The grader's own steps (staging, reading the reward) run as root.
   */
  user?: string;
}

/** Exec options that run a command as the tests' user; /logs/verifier is theirs to write. */
async function asTestUser(
  grader: Sandbox,
  user: string | undefined,
  deadline: Deadline,
): Promise<{ user?: string }> {
  if (!user) return {};
  const chown = await grader.exec(['chown', '-R', user, '/logs/verifier'], deadline.call());
  if (chown.exitCode !== 0)
    throw new SandgymError(
      'invalid_argument',
      `The tests are to run as "${user}", which the image does not know: ${chown.stderr.trim()}`,
    );
  return { user };
}

/**
 * A verifier run that went wrong in a way either side could have caused: the tests ran out of
 * time, the reward is missing or not a number in range, the runner never reported. The agent's
 * code runs inside the tests, so it can hang them or write a bad reward; a broken verifier does
 * the same. The grader tells them apart by running the verifier again without the agent's
 * changes (see TaskEnv.grade): if that run is sound, the agent's changes caused it and the
 * episode scores 0; if it fails too, the verifier is at fault (`verifier_error`).
 */
export class GradingAnomaly extends SandgymError {
  constructor(
    readonly kind: 'timeout' | 'no_reward' | 'bad_reward' | 'no_report',
    message: string,
  ) {
    super('failed_precondition', message);
  }
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

/** A reward and, from a reward.json, each named metric. */
interface ParsedReward {
  reward: number;
  metrics?: Record<string, number>;
}

/**
 * Reads reward.txt (one number) or reward.json (named numbers: `reward`, else their mean). Every
 * value must be a finite number within the task's range; anything else (text, NaN, Infinity,
 * 1e9, a nested object) is a {@link GradingAnomaly}, never a reward.
 */
export function parseReward(
  text: string,
  json: boolean,
  [min, max]: readonly [number, number],
): ParsedReward {
  const inRange = (value: unknown, what: string): number => {
    if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
      throw new GradingAnomaly(
        'bad_reward',
        `${what} is ${JSON.stringify(value) ?? String(value)}, not a finite number in [${min}, ${max}]`,
      );
    }
    return value;
  };
  if (!json) {
    const trimmed = text.trim();
    if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(trimmed))
      throw new GradingAnomaly(
        'bad_reward',
        `reward.txt holds ${JSON.stringify(trimmed.slice(0, 80))}, not a number`,
      );
    return { reward: inRange(Number(trimmed), 'reward.txt') };
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new GradingAnomaly('bad_reward', 'reward.json is not valid JSON');
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed))
    throw new GradingAnomaly('bad_reward', 'reward.json must be an object of named numbers');
  const entries = Object.entries(parsed as Record<string, unknown>);
  if (entries.length === 0) throw new GradingAnomaly('bad_reward', 'reward.json holds no number');
  const metrics = Object.fromEntries(
    entries.map(([name, value]) => [name, inRange(value, `reward.json "${name}"`)]),
  );
  const values = Object.values(metrics);
  const reward = metrics['reward'] ?? values.reduce((a, b) => a + b, 0) / values.length;
  return { reward, metrics };
}

/** The range rewards must fall in when a task names none. */
export const DEFAULT_REWARD_RANGE: readonly [number, number] = [0, 1];

/**
 * Harbor: stages the task's tests at /tests (in the grader only), makes /logs/verifier anew and
 * empty, runs /tests/test.sh through bash (executable or not), and reads reward.txt or
 * reward.json over the agent channel. Every step takes its time from the grading's deadline.
 */
export function rewardFileVerifier(testsDir: string, timeoutMs: number): Verifier {
  return async ({ grader, workdir, deadline, task, user }) => {
    await stageFolder(grader, testsDir, '/tests', deadline);
    await grader.exec(['rm', '-rf', '--', '/logs/verifier'], deadline.call());
    await grader.exec(['mkdir', '-p', '/logs/verifier'], deadline.call());
    const env = task.verifierEnv ?? {};
    const runAs = await asTestUser(grader, user, deadline);
    const runTests = (shell: string) =>
      grader.exec([shell, '/tests/test.sh'], {
        ...deadline.call(timeoutMs),
        ...runAs,
        cwd: workdir,
        ...(Object.keys(env).length ? { env } : {}),
      });
    let run = await runTests('bash');
    // an image without bash (busybox) runs the script with its sh
    if (run.exitCode === 127 && /cannot run bash/.test(run.stderr)) run = await runTests('sh');
    if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
    const files = (await grader.listDir('/logs/verifier', deadline.call())).map((e) => e.name);
    const json = files.includes('reward.json');
    if (!json && !files.includes('reward.txt')) {
      throw new GradingAnomaly(
        'no_reward',
        `tests/test.sh ended (exit ${run.exitCode ?? run.signal}) without writing /logs/verifier/reward.txt or reward.json`,
      );
    }
    const path = json ? '/logs/verifier/reward.json' : '/logs/verifier/reward.txt';
    const text = (await grader.readFile(path, { ...deadline.call(), maxBytes: 1 << 20 })).toString();
    const { reward, metrics } = parseReward(text, json, task.rewardRange ?? DEFAULT_REWARD_RANGE);
    return {
      reward,
      details: {
        reason: `tests/test.sh (exit ${run.exitCode ?? run.signal}) wrote ${json ? `reward.json ${text.trim().slice(0, 200)}` : `reward.txt ${text.trim()}`}`,
        exitCode: run.exitCode,
        ...outputTails(run),
        rewardFile: true,
        ...(metrics ? { metrics } : {}),
      },
    };
  };
}

/** What a test run may print and still be read whole: its summary comes last. */
const TEST_LOG_CAP_BYTES = 16 << 20;

/**
 * Terminal-Bench: stages tests/ and run-tests.sh at /tests (in the grader only), runs `bash
 * /tests/run-tests.sh` from the image's WORKDIR with TEST_DIR=/tests, and reads its output with
 * the pytest parser: reward 1 when the short test summary lists tests and each one passed
 * (PASSED, XFAIL or SKIPPED). Output without a summary is a run that went wrong, for the grader
 * to blame on the agent or the verifier.
 */
export function testLogVerifier(
  grading: Extract<TaskGrading, { kind: 'test_log' }>,
  timeoutMs: number,
): Verifier {
  return async ({ grader, workdir, deadline, task, user }) => {
    if (grading.testsDir) await stageFolder(grader, grading.testsDir, TESTS_DIR, deadline);
    await grader.exec(['mkdir', '-p', '/logs/verifier'], deadline.call());
    const runAs = await asTestUser(grader, user, deadline);
    await grader.writeFile(`${TESTS_DIR}/run-tests.sh`, await readFile(grading.runTests), deadline.call());
    const run = await grader.exec(['bash', `${TESTS_DIR}/run-tests.sh`], {
      ...deadline.call(timeoutMs),
      ...runAs,
      cwd: workdir,
      env: { ...task.env, ...task.verifierEnv, TEST_DIR: TESTS_DIR },
      outputCapBytes: TEST_LOG_CAP_BYTES,
    });
    if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
    const results = parsePytestSummary(`${run.stdout}\n${run.stderr}`);
    if (!results?.length) {
      throw new GradingAnomaly(
        'no_report',
        `run-tests.sh ended (exit ${run.exitCode ?? run.signal}) without a pytest short test summary that lists tests (pytest -rA prints one)`,
      );
    }
    const failed = results.filter((r) => !r.passed);
    return {
      reward: failed.length === 0 ? 1 : 0,
      details: {
        reason:
          failed.length === 0
            ? `all ${results.length} tests passed`
            : `${failed.length} of ${results.length} tests did not pass: ${failed
                .slice(0, 5)
                .map((r) => `${r.test} ${r.outcome}`)
                .join(', ')}${failed.length > 5 ? ', ...' : ''}`,
        exitCode: run.exitCode,
        tests: Object.fromEntries(results.map((r) => [r.test, r.outcome])),
        ...outputTails(run),
      },
    };
  };
}

/** How much of a verifier's output the report keeps, per stream: its end, where the verdict is. */
const OUTPUT_TAIL_CHARS = 4000;

/** The ends of a verifier run's stdout and stderr, for the report. */
function outputTails(run: { stdout: string; stderr: string }): { stdoutTail: string; stderrTail: string } {
  return {
    stdoutTail: run.stdout.slice(-OUTPUT_TAIL_CHARS),
    stderrTail: run.stderr.slice(-OUTPUT_TAIL_CHARS),
  };
}

/** Reward 1 when a command exits 0 in the grader, else 0. */
export function exitCodeVerifier(argv: string[], timeoutMs: number): Verifier {
  return async ({ grader, workdir, deadline }) => {
    const run = await grader.exec(argv, { ...deadline.call(timeoutMs), cwd: workdir });
    if (run.timedOut)
      throw new GradingAnomaly('timeout', `The verifier command ran out of its ${timeoutMs} ms`);
    return {
      reward: run.exitCode === 0 ? 1 : 0,
      details: {
        reason: `the verifier command exited ${run.exitCode ?? run.signal}`,
        exitCode: run.exitCode,
        ...outputTails(run),
      },
    };
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
  return async ({ grader, workdir, platform, environment, task, deadline }) => {
    const source = await grader.readFile(program, deadline.call()).catch(() => undefined);
    if (!source)
      return {
        reward: 0,
        details: {
          reason: `no program at ${program}`,
          cases: cases.map(() => 'no_program'),
          passed: 0,
          total: cases.length,
        },
      };
    const judge = await platform.createSandbox({
      backend: 'fncall',
      environment,
      resources: { cpu: task.resources.cpu, memoryMib: task.resources.memoryMib },
    });
    try {
      await judge.writeFile(program, source, { ...deadline.call(), mode: 0o755 });
      const statuses: string[] = [];
      for (const testCase of cases) {
        const result = await judge.exec(run, {
          ...deadline.call(caseTimeoutMs),
          stdin: testCase.stdin,
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
        details: {
          reason: `${passed} of ${cases.length} cases accepted`,
          cases: statuses,
          passed,
          total: cases.length,
          judgedBy: 'fncall',
        },
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

# Rewiring is replacing behaviour: a changed or added function, method or class. pytest keeps
# flags of its own on its classes as it runs (_pytest_diamond_inheritance_warning_shown, say),
# which change no result.
def behaviour(value):
    return callable(value) or isinstance(value, (classmethod, staticmethod, property))
tampered = sorted(
    f'{getattr(holder, "__name__", holder)}.{name}'
    for holder, saved in before
    for name, value in vars(holder).items()
    if name in saved and saved[name] is not value and (behaviour(value) or behaviour(saved[name]))
    or name not in saved and isinstance(holder, type) and behaviour(value)
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
async function runnerReport(
  grader: Sandbox,
  deadline: Deadline,
): Promise<z.infer<typeof runnerReportSchema> | undefined> {
  try {
    return runnerReportSchema.parse(
      JSON.parse((await grader.readFile('/logs/verifier/report.json', deadline.call())).toString()),
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

/**
 * git as the grader runs it: no system or global configuration, no hooks and no fsmonitor, so a
 * command planted in any git configuration never runs (the repository's own .git comes from the
 * task's layers: graders leave it out of the diff).
 */
function gitIn(grader: Sandbox, repo: string, deadline: Deadline) {
  return (...args: string[]) =>
    grader.exec(
      ['git', '-C', repo, '-c', 'core.hooksPath=/dev/null', '-c', 'core.fsmonitor=false', ...args],
      { ...deadline.call(), env: { GIT_CONFIG_NOSYSTEM: '1', GIT_CONFIG_GLOBAL: '/dev/null' } },
    );
}

/** Restores the test harness files of `repo` to the base commit; returns the ones it changed. */
async function restoreTestHarness(
  grader: Sandbox,
  repo: string,
  baseCommit: string,
  deadline: Deadline,
): Promise<string[]> {
  const git = gitIn(grader, repo, deadline);
  const lines = (text: string): string[] => text.split('\n').filter(Boolean);
  const untracked = lines((await git('ls-files', '--others')).stdout).filter((f) =>
    TEST_HARNESS_FILES.test(f),
  );
  const changed = lines((await git('diff', '--name-only', baseCommit)).stdout).filter((f) =>
    TEST_HARNESS_FILES.test(f),
  );
  for (const file of untracked) await grader.exec(['rm', '-f', '--', `${repo}/${file}`], deadline.call());
  for (const file of changed) {
    const existed = (await git('cat-file', '-e', `${baseCommit}:${file}`)).exitCode === 0;
    if (existed) await git('checkout', '-q', baseCommit, '--', file);
    else await grader.exec(['rm', '-f', '--', `${repo}/${file}`], deadline.call());
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
  return async ({ grader, deadline }) => {
    const repo = grading.repoPath;
    const git = gitIn(grader, repo, deadline);
    const dirs = [
      ...new Set(
        patchedFiles(grading.testPatch).map((file) => file.split('/').slice(0, -1).join('/') || '.'),
      ),
    ];
    for (const dir of dirs) {
      await git('checkout', '-q', grading.baseCommit, '--', dir);
      await git('clean', '-fdxq', '--', dir);
    }
    const restored = await restoreTestHarness(grader, repo, grading.baseCommit, deadline);
    await grader.writeFile('/sandgym-runner/test.patch', grading.testPatch, deadline.call());
    const applied = await git('apply', '/sandgym-runner/test.patch');
    if (applied.exitCode !== 0)
      throw new SandgymError(
        'failed_precondition',
        `The test patch does not apply: ${applied.stderr.trim()}`,
      );
    const ids = [...grading.failToPass, ...grading.passToPass];
    if (grading.runner) {
      const run = await runRepoTests(grader, grading, grading.runner, deadline, timeoutMs);
      const parse = grading.runner.parser === 'django' ? parseDjangoLog : parseSympyLog;
      const logged = parse(`${run.stdout}\n${run.stderr}`);
      return sweBenchVerdict(grading, (id) => logged.get(id) ?? 'missing', restored, [], run);
    }
    await grader.writeFile('/sandgym-runner/run_tests.py', SWEBENCH_RUNNER, deadline.call());
    await grader.exec(['rm', '-rf', '--', '/logs/verifier'], deadline.call());
    await grader.exec(['mkdir', '-p', '/logs/verifier'], deadline.call());
    const run = await grader.exec(
      ['python3', '-I', '/sandgym-runner/run_tests.py', repo, '/logs/verifier/report.json', ...ids],
      { ...deadline.call(timeoutMs), cwd: repo },
    );
    if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
    const report = await runnerReport(grader, deadline);
    // the runner always finishes and says so: if it did not, the code under test ended it
    if (!report || run.exitCode !== 0) {
      return {
        reward: 0,
        details: {
          reason: `the test runner did not finish (exit ${run.exitCode ?? run.signal})`,
          resolved: false,
          runner: `did not finish (exit ${run.exitCode ?? run.signal})`,
          restoredHarnessFiles: restored,
          ...outputTails(run),
        },
      };
    }
    return sweBenchVerdict(
      grading,
      (id) => report.statuses[id] ?? 'missing',
      restored,
      report.harnessTampered,
      run,
    );
  };
}

/** Test files of the patch as the repository's runner takes them: Django labels, or the paths. */
function runnerTargets(runner: RepoTestRunner, testPatch: string): string[] {
  const files = patchedFiles(testPatch).filter((f) => f.endsWith('.py'));
  if (runner.targets === 'files') return files;
  // tests/admin_views/tests.py is the label admin_views.tests
  return files
    .filter((f) => f.startsWith('tests/'))
    .map((f) => f.slice('tests/'.length, -'.py'.length).replaceAll('/', '.'));
}

/**
 * Runs a repository's own test runner on the test patch's files, its own files first put back
 * as they were at the base commit (an agent's edit to the runner would judge its own work).
 */
async function runRepoTests(
  grader: Sandbox,
  grading: Extract<TaskGrading, { kind: 'swebench' }>,
  runner: RepoTestRunner,
  deadline: Deadline,
  timeoutMs: number,
): Promise<Awaited<ReturnType<Sandbox['exec']>>> {
  const git = gitIn(grader, grading.repoPath, deadline);
  for (const file of runner.harness) {
    if ((await git('cat-file', '-e', `${grading.baseCommit}:${file}`)).exitCode === 0)
      await git('checkout', '-q', grading.baseCommit, '--', file);
  }
  const targets = runnerTargets(runner, grading.testPatch).map((t) => `'${t.replaceAll("'", "'\\''")}'`);
  const run = await grader.exec(['bash', '-c', runner.command.replace('{tests}', targets.join(' '))], {
    ...deadline.call(timeoutMs),
    cwd: grading.repoPath,
    outputCapBytes: 16 << 20,
  });
  if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
  return run;
}

/** SWE-bench's verdict: resolved only when every FAIL_TO_PASS and PASS_TO_PASS test passed. */
function sweBenchVerdict(
  grading: Extract<TaskGrading, { kind: 'swebench' }>,
  status: (id: string) => string,
  restored: string[],
  harnessTampered: string[],
  run: { stdout: string; stderr: string },
): VerifierResult {
  const ids = [...grading.failToPass, ...grading.passToPass];
  const failToPass = Object.fromEntries(grading.failToPass.map((id) => [id, status(id)]));
  const passToPass = Object.fromEntries(grading.passToPass.map((id) => [id, status(id)]));
  const resolved = ids.every((id) => status(id) === 'passed');
  const notPassed = ids.filter((id) => status(id) !== 'passed');
  return {
    reward: resolved ? 1 : 0,
    details: {
      reason: resolved
        ? `all ${ids.length} tests passed`
        : `${notPassed.length} of ${ids.length} tests did not pass: ${notPassed
            .slice(0, 5)
            .map((id) => `${id} (${status(id)})`)
            .join(', ')}${notPassed.length > 5 ? ', ...' : ''}`,
      resolved,
      failToPass,
      passToPass,
      ...(restored.length ? { restoredHarnessFiles: restored } : {}),
      ...(harnessTampered.length ? { harnessTampered } : {}),
      ...outputTails(run),
    },
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
    case 'test_log':
      return testLogVerifier(grading, task.verifierTimeoutMs);
    case 'oj':
      return ojVerifier(grading.program, grading.run, grading.cases, grading.caseTimeoutMs);
    case 'swebench':
      return sweBenchVerifier(grading, task.verifierTimeoutMs);
  }
}
