import { readFile } from 'node:fs/promises';
import { parsePytestSummary } from '../pytest-summary.ts';
import { stageFolder } from '../stage-folder.ts';
import type { TaskGrading } from '../tasks/task.ts';
import { TERMINAL_BENCH_TEST_DIR as TESTS_DIR } from '../tasks/terminal-bench.ts';
import { GradingAnomaly, asTestUser, outputTails, type Verifier } from './chain.ts';

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
