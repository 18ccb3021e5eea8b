import { readRegularFile } from '../../common/index.ts';
import { PASSING_OUTCOMES, parsePytestSummary, type PytestResult } from '../pytest-summary.ts';
import { stageFolder } from '../stage-folder.ts';
import type { TaskGrading } from '../tasks/task.ts';
import { TERMINAL_BENCH_TEST_DIR as TESTS_DIR } from '../tasks/terminal-bench.ts';
import {
  GradingAnomaly,
  asTestUser,
  endLeftoverProcesses,
  judgeRun,
  outputTails,
  type Verifier,
  timedTests,
} from './chain.ts';
import { harnessEnv, stageHarness } from './harness.ts';
import {
  checkOutcomesDecidedByTests,
  checkRunSound,
  harnessDetails,
  readHarnessReport,
  type HarnessReport,
} from './harness-report.ts';

/** What a test run may print and still be read whole: its summary comes last. */
const TEST_LOG_CAP_BYTES = 16 << 20;

/** A node id less its file (`TestX::test_y[1]`): printed and reported ids agree on that part. */
function inFile(nodeId: string): string {
  return nodeId.includes('::') ? nodeId.slice(nodeId.indexOf('::') + 2) : nodeId;
}

/**
 * What run-tests.sh printed must be what pytest reported through the harness: a summary line for
 * a test that pytest never ran, or with another outcome than pytest gave it, was printed by
 * something else (the code under test writing into the runner's output).
 */
function checkPrintedAgainstReport(printed: PytestResult[], report: HarnessReport): void {
  if (report.processes === 0) return; // pytest ran without sandgym's reporter: nothing to check against
  const reported = new Map<string, Set<boolean>>();
  for (const [nodeId, outcome] of report.tests) {
    const test = inFile(nodeId);
    reported.set(test, (reported.get(test) ?? new Set()).add(PASSING_OUTCOMES.has(outcome)));
  }
  const skipped = [...report.tests.values()].filter((outcome) => outcome === 'SKIPPED').length;
  // only a line that passes can forge a pass: one that fails lowers the reward whoever printed it
  for (const result of printed.filter((r) => r.passed)) {
    if (reported.get(inFile(result.nodeId))?.has(true)) continue;
    // skips are summed up by location (`SKIPPED [2] test_x.py:10: reason`), with no test to match:
    // pytest must have skipped something
    if (result.outcome === 'SKIPPED' && /^\[\d+\] /.test(result.test) && skipped + report.skippedFiles > 0)
      continue;
    throw new GradingAnomaly(
      'forged_output',
      `run-tests.sh printed "${result.outcome} ${result.test}", which pytest did not report${reported.has(result.test) ? ' with that outcome' : ''}: something else wrote into the test runner's output`,
    );
  }
}

/**
 * Terminal-Bench: stages tests/ and run-tests.sh at /tests and sandgym's harness (in the grader
 * only), runs `bash /tests/run-tests.sh` from the image's WORKDIR with TEST_DIR=/tests and a
 * report channel, and reads its output with the pytest parser: reward 1 when the short test
 * summary lists tests, each one passed (PASSED, XFAIL or SKIPPED), and pytest itself reported the
 * same through the harness. Output without a summary, a summary pytest did not report, or a run
 * that was killed or never finished is a run that went wrong, for the grader to blame on the
 * agent or the verifier.
 */
export function testLogVerifier(
  grading: Extract<TaskGrading, { kind: 'test_log' }>,
  timeoutMs: number,
): Verifier {
  return async (context) => {
    const { grader, workdir, deadline, task, user } = context;
    if (grading.testsDir) await stageFolder(grader, grading.testsDir, TESTS_DIR, deadline);
    await stageHarness(grader, deadline);
    await grader.exec(['mkdir', '-p', '/logs/verifier'], deadline.call());
    const runAs = await asTestUser(grader, user, deadline);
    await grader.writeFile(
      `${TESTS_DIR}/run-tests.sh`,
      (await readRegularFile(grading.runTests, `Task file ${grading.runTests}`))!,
      deadline.call(),
    );
    const run = await timedTests(context, () =>
      grader.exec(['bash', `${TESTS_DIR}/run-tests.sh`], {
        ...deadline.call(timeoutMs),
        ...runAs,
        cwd: workdir,
        env: harnessEnv(context, { ...task.env, ...task.verifierEnv, TEST_DIR: TESTS_DIR }),
        outputCapBytes: TEST_LOG_CAP_BYTES,
        reportChannel: true,
      }),
    );
    await endLeftoverProcesses(grader, deadline);
    return judgeRun(run, () => {
      if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
      const harness = readHarnessReport(run);
      checkRunSound('run-tests.sh', run, harness);
      const results = parsePytestSummary(`${run.stdout}\n${run.stderr}`);
      if (!results?.length) {
        throw new GradingAnomaly(
          'no_report',
          `run-tests.sh ended (exit ${run.exitCode ?? run.signal}) without a pytest short test summary that lists tests (pytest -rA prints one)`,
        );
      }
      checkPrintedAgainstReport(results, harness);
      // what pytest reported failing counts even where the printed summary left it out
      const printedFailing = new Set(results.filter((r) => !r.passed).map((r) => inFile(r.nodeId)));
      const failed = [
        ...results.filter((r) => !r.passed),
        ...[...harness.tests]
          .filter(([id, outcome]) => !PASSING_OUTCOMES.has(outcome) && !printedFailing.has(inFile(id)))
          .map(([test, outcome]) => ({ test, outcome })),
      ];
      const verdict = {
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
          ...harnessDetails(harness),
          ...outputTails(run),
        },
      };
      checkOutcomesDecidedByTests(harness, verdict);
      return verdict;
    });
  };
}
