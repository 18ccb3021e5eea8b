import { z } from 'zod';
import type { ExecResult } from '../../backends/index.ts';
import type { PytestOutcome } from '../pytest-summary.ts';
import { GradingAnomaly, type VerifierResult } from './chain.ts';

/**
 * What every record carries: the process, the token it drew when it loaded the reporter (a new
 * process image under the same pid draws another), and how deep in nested pytest sessions it was.
 */
const origin = {
  pid: z.number().int().positive(),
  k: z.string().regex(/^[0-9a-f]{16}$/),
  d: z.number().int().nonnegative(),
};
const session = z.number().int().nonnegative();

/** The lines sandgym's pytest reporter (harness/sandgym_pytest_report.py) writes. */
const recordSchema = z.discriminatedUnion('t', [
  z.strictObject({ t: z.literal('load'), ...origin }),
  z.strictObject({ t: z.literal('exit'), ...origin }),
  z.strictObject({ t: z.literal('start'), ...origin, s: session }),
  z.strictObject({ t: z.literal('end'), ...origin, s: session }),
  z.strictObject({ t: z.literal('collect_error'), ...origin, s: session, nodeid: z.string() }),
  z.strictObject({
    t: z.literal('collect_skip'),
    ...origin,
    s: session,
    nodeid: z.string(),
    foreign: z.boolean(),
  }),
  z.strictObject({
    t: z.literal('test'),
    ...origin,
    s: session,
    nodeid: z.string().max(4096),
    when: z.enum(['setup', 'call', 'teardown']),
    outcome: z.enum(['passed', 'failed', 'skipped', 'error']),
    xfail: z.boolean(),
    foreign: z.literal(true).optional(),
  }),
  z.strictObject({ t: z.literal('interrupted'), ...origin, s: session }),
  z.strictObject({
    t: z.literal('finish'),
    ...origin,
    s: session,
    exitstatus: z.number().int(),
    failed: z.number().int().nonnegative(),
    collected: z.number().int().nonnegative(),
  }),
  z.strictObject({
    t: z.literal('rewired'),
    ...origin,
    s: session,
    names: z.array(z.string().max(512)).max(50),
  }),
  z.strictObject({
    t: z.literal('runner'),
    ...origin,
    name: z.string().max(64),
    tampered: z.array(z.string().max(512)).max(50),
  }),
]);

type HarnessRecord = z.infer<typeof recordSchema>;

/** What the harness reported of a grading run, put together. */
export interface HarnessReport {
  /** Python processes that loaded the pytest reporter (or a runner of ours). */
  processes: number;
  /** Of them, those that never reported a normal exit: killed, `os._exit`, crashed. */
  unfinished: number[];
  /** Each test's outcome by node id, as pytest's summary would name it. */
  tests: Map<string, PytestOutcome>;
  /** Collection errors, by the node id of what failed to collect. */
  collectErrors: string[];
  /** Runners of sandgym's own that finished, with what each found rewired. */
  runners: { name: string; tampered: string[] }[];
  /** pytest machinery whose behaviour was replaced while the tests ran. */
  rewired: string[];
  /** Tests (or test files) skipped, expected to fail or stopped by a raise from outside the tests' own files. */
  decidedElsewhere: string[];
  /** Whether a session was stopped before its end (`pytest.exit`, an interrupt). */
  interrupted: boolean;
  /** Test files skipped whole while they were collected. */
  skippedFiles: number;
}

/** Folds one test's phases into the outcome pytest's summary would show for it. */
function foldOutcome(earlier: PytestOutcome | undefined, record: Extract<HarnessRecord, { t: 'test' }>) {
  const { when, outcome, xfail } = record;
  let now: PytestOutcome | undefined;
  if (outcome === 'failed' || outcome === 'error')
    now = when === 'call' ? (xfail ? 'XPASS' : 'FAILED') : 'ERROR';
  else if (outcome === 'skipped') now = xfail ? 'XFAIL' : 'SKIPPED';
  else if (when === 'call') now = xfail ? 'XPASS' : 'PASSED';
  // a failure in any phase wins over what the others said
  const rank = (o: PytestOutcome | undefined): number =>
    o === 'ERROR' || o === 'FAILED' ? 2 : o === undefined ? 0 : 1;
  return rank(now) >= rank(earlier) && now ? now : earlier;
}

/**
 * Reads the report channel of a verifier's run. Anything on it that sandgym's harness would not
 * write (a line that is not one of its records, a report cut at the output cap) was written by
 * something else that held the channel — the code under test — and is an anomaly.
 */
export function readHarnessReport(run: Pick<ExecResult, 'report' | 'reportTruncated'>): HarnessReport {
  if (run.reportTruncated)
    throw new GradingAnomaly(
      'forged_report',
      'The harness report went past its cap: something wrote more to it than the harness would',
    );
  const loaded = new Set<string>();
  const exited = new Set<string>();
  const tests = new Map<string, PytestOutcome>();
  const collectErrors: string[] = [];
  const runners: HarnessReport['runners'] = [];
  const rewired: string[] = [];
  const decidedElsewhere: string[] = [];
  let interrupted = false;
  let skippedFiles = 0;
  for (const [index, line] of (run.report ?? '').split('\n').entries()) {
    if (!line) continue;
    let record: HarnessRecord;
    try {
      record = recordSchema.parse(JSON.parse(line));
    } catch {
      throw new GradingAnomaly(
        'forged_report',
        `Line ${index + 1} of the harness report is not a record sandgym's harness writes: ${JSON.stringify(line.slice(0, 120))}`,
      );
    }
    const process = `${record.pid}:${record.k}`;
    // sessions that tests run inside the run (pytester) report their own tests: not the run's
    const outermost = record.d <= 1;
    if (record.t === 'load') loaded.add(process);
    else if (record.t === 'exit') exited.add(process);
    else if (record.t === 'rewired') rewired.push(...record.names);
    else if (record.t === 'runner') runners.push({ name: record.name, tampered: record.tampered });
    else if (!outermost) continue;
    else if (record.t === 'collect_error') collectErrors.push(record.nodeid);
    else if (record.t === 'collect_skip') {
      skippedFiles++;
      if (record.foreign) decidedElsewhere.push(record.nodeid);
    } else if (record.t === 'interrupted') interrupted = true;
    else if (record.t === 'test') {
      const folded = foldOutcome(tests.get(record.nodeid), record);
      if (folded) tests.set(record.nodeid, folded);
      if (record.foreign) decidedElsewhere.push(record.nodeid);
    }
  }
  return {
    processes: loaded.size,
    unfinished: [...loaded].filter((id) => !exited.has(id)).map((id) => Number(id.split(':')[0])),
    tests,
    collectErrors,
    runners,
    rewired,
    decidedElsewhere: [...new Set(decidedElsewhere)],
    interrupted,
    skippedFiles,
  };
}

/**
 * Fails grading with an anomaly when the run did not end as a sound one does: the verifier's own
 * command died by a signal (the code under test may have killed it after forging its output or
 * the reward), a pytest (or runner of ours) that started never reported a normal exit (killed,
 * `os._exit` at import, a crash), or pytest's machinery was rewired while the tests ran. The
 * grader then runs the tests without the agent's changes to tell who is at fault.
 */
export function checkRunSound(
  what: string,
  run: Pick<ExecResult, 'signal' | 'exitCode'>,
  report: HarnessReport,
): void {
  if (run.signal)
    throw new GradingAnomaly('killed', `${what} was killed by ${run.signal} before it could finish`);
  if (report.unfinished.length)
    throw new GradingAnomaly(
      'runner_ended_early',
      `${report.unfinished.length} of the ${report.processes} test runs ${what} started ended without finishing (pid ${report.unfinished.join(', ')}: killed, or os._exit before pytest could report)`,
    );
  if (report.rewired.length)
    throw new GradingAnomaly(
      'harness_rewired',
      `While the tests ran, something replaced pytest's own ${report.rewired.slice(0, 5).join(', ')}${report.rewired.length > 5 ? ', ...' : ''}`,
    );
  if (report.interrupted)
    throw new GradingAnomaly(
      'run_interrupted',
      `${what} ran a pytest session that was stopped before its end`,
    );
}

/**
 * Fails grading with an anomaly when a skip, an expected failure or an exit that decided a test's
 * outcome was raised from outside the tests' own files (the code under test calling
 * `pytest.skip()`): where skipped tests count as passed (Terminal-Bench) or pytest's exit status
 * decides the reward (Harbor), that is a pass the tests never gave. It carries the run's `verdict`:
 * a task whose tests are skipped that way without the agent's changes too stands as it is.
 */
export function checkOutcomesDecidedByTests(report: HarnessReport, verdict: VerifierResult): void {
  if (report.decidedElsewhere.length === 0) return;
  throw new GradingAnomaly(
    'decided_by_code_under_test',
    `Code outside the tests skipped or stopped ${report.decidedElsewhere.slice(0, 5).join(', ')}${report.decidedElsewhere.length > 5 ? ', ...' : ''}`,
    verdict,
  );
}

/** Whether pytest reported a test of the run failing or erroring, or a file that did not collect. */
export function reportsFailures(report: HarnessReport): boolean {
  return (
    report.collectErrors.length > 0 ||
    [...report.tests.values()].some((outcome) => outcome === 'FAILED' || outcome === 'ERROR')
  );
}

/** A summary of the harness report for a grade's details. */
export function harnessDetails(report: HarnessReport): Record<string, unknown> {
  const failing = [...report.tests].filter(([, outcome]) => outcome === 'FAILED' || outcome === 'ERROR');
  return {
    harness: {
      processes: report.processes,
      tests: report.tests.size,
      failing: failing.slice(0, 20).map(([id, outcome]) => `${id} ${outcome}`),
      ...(report.collectErrors.length ? { collectErrors: report.collectErrors.slice(0, 20) } : {}),
    },
  };
}
