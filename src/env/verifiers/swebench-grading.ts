import type { PytestOutcome } from '../pytest-summary.ts';
import type { LoggedStatus } from '../repo-test-logs.ts';

/** A test's status in SWE-bench's terms, or `missing` when the run never named it. */
export type SweBenchStatus = LoggedStatus | 'missing';

/**
 * What SWE-bench makes of each outcome pytest reports. Its log parsers know no XPASS (an XPASS
 * line names no test they read), so an unexpected pass counts as a test that did not run; an
 * XFAIL grades as a pass.
 */
const STATUS_OF_OUTCOME: Record<PytestOutcome, SweBenchStatus> = {
  PASSED: 'passed',
  XFAIL: 'passed',
  FAILED: 'failed',
  ERROR: 'error',
  SKIPPED: 'skipped',
  XPASS: 'missing',
};

/** Repositories whose log parser shortens a path parameter to its last part (parse_log_pytest_options). */
const PATH_PARAMETERS = new Set(['psf/requests', 'pydicom/pydicom', 'pylint-dev/pylint']);

/**
 * A pytest node id as swebench's log parser for `repo` names the test, which is how the row's
 * FAIL_TO_PASS and PASS_TO_PASS lists name it: matplotlib's MouseButton.LEFT and RIGHT are 1 and
 * 3, and some repositories keep only the last part of a path parameter (`test_x[/server.pem]`).
 */
function rowIdOf(repo: string, nodeId: string): string {
  if (repo === 'matplotlib/matplotlib')
    return nodeId.replaceAll('MouseButton.LEFT', '1').replaceAll('MouseButton.RIGHT', '3');
  const parametrized = PATH_PARAMETERS.has(repo) ? /^(.*?)\[(.*)\]/.exec(nodeId) : null;
  if (!parametrized) return nodeId;
  const [, main, option] = parametrized as unknown as [string, string, string];
  const shortened =
    option.startsWith('/') && !option.startsWith('//') && !option.includes('*')
      ? `/${option.split('/').at(-1)}`
      : option;
  return `${main}[${shortened}]`;
}

/** pytest's outcomes by node id, as SWE-bench's statuses under the ids `repo`'s rows use. */
export function statusesOfOutcomes(
  repo: string,
  outcomes: Iterable<[string, PytestOutcome]>,
): Map<string, SweBenchStatus> {
  return new Map([...outcomes].map(([id, outcome]) => [rowIdOf(repo, id), STATUS_OF_OUTCOME[outcome]]));
}

/**
 * The status of a row's test id, as swebench's grading looks it up (`_resolve_case`): the id
 * itself, else, for an id cut off inside its parameters (more `[` than `]`, as hundreds of
 * published rows are), the first test it begins when all those it begins agree on pass or fail.
 */
export function statusOf(statuses: ReadonlyMap<string, SweBenchStatus>, id: string): SweBenchStatus {
  const exact = statuses.get(id);
  if (exact) return exact;
  if (id.split('[').length <= id.split(']').length) return 'missing';
  const begun = [...statuses].filter(([name]) => name.startsWith(id));
  const verdicts = new Set(begun.map(([, status]) => status === 'passed'));
  return begun.length > 0 && verdicts.size === 1 ? begun[0]![1] : 'missing';
}

/** Which tests of a list succeeded and which did not. */
export interface SweBenchTally {
  success: string[];
  failure: string[];
}

/** swebench's tests report on a row: its FAIL_TO_PASS and PASS_TO_PASS tests, and the verdict. */
export interface SweBenchReport {
  failToPass: SweBenchTally;
  passToPass: SweBenchTally;
  resolved: boolean;
}

/**
 * SWE-bench's verdict: every FAIL_TO_PASS test passed, and every PASS_TO_PASS test passed or was
 * skipped (a skip is no regression; a FAIL_TO_PASS test that skips fixed nothing).
 */
export function sweBenchReport(
  row: { failToPass: readonly string[]; passToPass: readonly string[] },
  status: (id: string) => SweBenchStatus,
): SweBenchReport {
  const tally = (ids: readonly string[], passes: (s: SweBenchStatus) => boolean): SweBenchTally => ({
    success: ids.filter((id) => passes(status(id))),
    failure: ids.filter((id) => !passes(status(id))),
  });
  const failToPass = tally(row.failToPass, (s) => s === 'passed');
  const passToPass = tally(row.passToPass, (s) => s === 'passed' || s === 'skipped');
  return {
    failToPass,
    passToPass,
    resolved: failToPass.failure.length === 0 && passToPass.failure.length === 0,
  };
}
