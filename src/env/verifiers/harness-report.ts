import { z } from 'zod';
import type { ExecResult } from '../../backends/index.ts';
import type { PytestOutcome } from '../pytest-summary.ts';
import { GradingAnomaly } from './chain.ts';

const pid = z.number().int().positive();
const session = z.number().int().nonnegative();

/** The lines sandgym's pytest reporter (harness/sandgym_pytest_report.py) writes. */
const recordSchema = z.discriminatedUnion('t', [
  z.strictObject({ t: z.literal('load'), pid }),
  z.strictObject({ t: z.literal('exit'), pid }),
  z.strictObject({ t: z.literal('start'), pid, s: session }),
  z.strictObject({ t: z.literal('end'), pid, s: session }),
  z.strictObject({ t: z.literal('collect_error'), pid, s: session, nodeid: z.string() }),
  z.strictObject({
    t: z.literal('test'),
    pid,
    s: session,
    nodeid: z.string().max(4096),
    when: z.enum(['setup', 'call', 'teardown']),
    outcome: z.enum(['passed', 'failed', 'skipped', 'error']),
    xfail: z.boolean(),
  }),
  z.strictObject({
    t: z.literal('finish'),
    pid,
    s: session,
    exitstatus: z.number().int(),
    failed: z.number().int().nonnegative(),
    collected: z.number().int().nonnegative(),
  }),
  z.strictObject({
    t: z.literal('rewired'),
    pid,
    s: session,
    names: z.array(z.string().max(512)).max(50),
  }),
  z.strictObject({
    t: z.literal('runner'),
    pid,
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
  const loaded = new Set<number>();
  const exited = new Set<number>();
  const tests = new Map<string, PytestOutcome>();
  const collectErrors: string[] = [];
  const runners: HarnessReport['runners'] = [];
  const rewired: string[] = [];
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
    if (record.t === 'load') loaded.add(record.pid);
    else if (record.t === 'exit') exited.add(record.pid);
    else if (record.t === 'collect_error') collectErrors.push(record.nodeid);
    else if (record.t === 'rewired') rewired.push(...record.names);
    else if (record.t === 'runner') {
      loaded.add(record.pid);
      runners.push({ name: record.name, tampered: record.tampered });
    } else if (record.t === 'test') {
      const folded = foldOutcome(tests.get(record.nodeid), record);
      if (folded) tests.set(record.nodeid, folded);
    }
  }
  return {
    processes: loaded.size,
    unfinished: [...loaded].filter((id) => !exited.has(id)),
    tests,
    collectErrors,
    runners,
    rewired,
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
