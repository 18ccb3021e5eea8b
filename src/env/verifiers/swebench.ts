import { readFileSync } from 'node:fs';
import { SandgymError } from '../../common/index.ts';
import type { Sandbox } from '../../platform/index.ts';
import type { Deadline } from '../deadline.ts';
import { parseDjangoLog, parseSympyLog } from '../repo-test-logs.ts';
import type { TaskGrading } from '../tasks/task.ts';
import type { RepoTestRunner } from '../tasks/swebench-repos.ts';
import {
  GradingAnomaly,
  endLeftoverProcesses,
  judgeRun,
  outputTails,
  type Verifier,
  type VerifierResult,
  type VerifyContext,
  timedTests,
} from './chain.ts';
import { harnessEnv, stageHarness } from './harness.ts';
import { checkRunSound, readHarnessReport } from './harness-report.ts';
import { statusOf, statusesOfOutcomes, sweBenchReport, type SweBenchStatus } from './swebench-grading.ts';

/**
 * The test runner staged into the grader for SWE-bench tasks. Ids are unittest names
 * (`tests.test_ops.OpsTest.test_mean`) or pytest node ids (`tests/test_ops.py::test_mean[1]`).
 * Python runs isolated (-I: no current folder, script folder or PYTHON* variables on the path)
 * with sandgym's import guard installed first, so a planted unittest.py or pytest.py cannot stand
 * in for them. Every test's outcome goes out on the run's report channel as it is known, and the
 * runner says it finished there; a requested id without an outcome counts as failed.
 */
const SWEBENCH_RUNNER = readFileSync(new URL('./swebench_runner.py', import.meta.url), 'utf8');

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
  return async (context) => {
    const { grader, deadline } = context;
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
      const run = await runRepoTests(context, grading, grading.runner, timeoutMs);
      const parse = grading.runner.parser === 'django' ? parseDjangoLog : parseSympyLog;
      const logged = parse(`${run.stdout}\n${run.stderr}`);
      return sweBenchVerdict(grading, (id) => statusOf(logged, id), restored, [], run);
    }
    await stageHarness(grader, deadline);
    await grader.writeFile('/sandgym-runner/run_tests.py', SWEBENCH_RUNNER, deadline.call());
    const run = await timedTests(context, () =>
      grader.exec(['python3', '-I', '/sandgym-runner/run_tests.py', repo, ...ids], {
        ...deadline.call(timeoutMs),
        cwd: repo,
        reportChannel: true,
        outputCapBytes: 16 << 20,
      }),
    );
    await endLeftoverProcesses(grader, deadline);
    return judgeRun(run, () => {
      if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
      const report = readHarnessReport(run);
      checkRunSound('the test runner', run, report);
      // the runner always finishes and says so: if it did not, the code under test ended it
      const runner = report.runners.find((r) => r.name === 'swebench');
      if (!runner)
        throw new GradingAnomaly(
          'runner_ended_early',
          `the test runner did not finish (exit ${run.exitCode ?? run.signal}) and never said it had`,
        );
      const statuses = statusesOfOutcomes(grading.repo, report.tests);
      const status = (id: string): SweBenchStatus =>
        runner.tampered.length ? 'error' : statusOf(statuses, id);
      return sweBenchVerdict(grading, status, restored, runner.tampered, run);
    });
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
  context: VerifyContext,
  grading: Extract<TaskGrading, { kind: 'swebench' }>,
  runner: RepoTestRunner,
  timeoutMs: number,
): Promise<Awaited<ReturnType<Sandbox['exec']>>> {
  const { grader, deadline } = context;
  const git = gitIn(grader, grading.repoPath, deadline);
  for (const file of runner.harness) {
    if ((await git('cat-file', '-e', `${grading.baseCommit}:${file}`)).exitCode === 0)
      await git('checkout', '-q', grading.baseCommit, '--', file);
  }
  const targets = runnerTargets(runner, grading.testPatch).map((t) => `'${t.replaceAll("'", "'\\''")}'`);
  await stageHarness(grader, deadline);
  const run = await timedTests(context, () =>
    grader.exec(['bash', '-c', runner.command.replace('{tests}', targets.join(' '))], {
      ...deadline.call(timeoutMs),
      cwd: grading.repoPath,
      env: harnessEnv(context, {}),
      outputCapBytes: 16 << 20,
      reportChannel: true,
    }),
  );
  await endLeftoverProcesses(grader, deadline);
  if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
  checkRunSound("the repository's test runner", run, readHarnessReport(run));
  return run;
}

/** SWE-bench's verdict on the row's tests (see {@link sweBenchReport}), with what it rests on. */
function sweBenchVerdict(
  grading: Extract<TaskGrading, { kind: 'swebench' }>,
  status: (id: string) => SweBenchStatus,
  restored: string[],
  harnessTampered: string[],
  run: { stdout: string; stderr: string },
): VerifierResult {
  const ids = [...grading.failToPass, ...grading.passToPass];
  const failToPass = Object.fromEntries(grading.failToPass.map((id) => [id, status(id)]));
  const passToPass = Object.fromEntries(grading.passToPass.map((id) => [id, status(id)]));
  const { resolved, ...report } = sweBenchReport(grading, status);
  const notPassed = [...report.failToPass.failure, ...report.passToPass.failure];
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
