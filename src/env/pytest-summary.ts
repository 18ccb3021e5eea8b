/** What pytest says of one test in its short test summary (`pytest -rA`). */
export type PytestOutcome = 'PASSED' | 'FAILED' | 'ERROR' | 'SKIPPED' | 'XFAIL' | 'XPASS';

const OUTCOMES = new Set<string>(['PASSED', 'FAILED', 'ERROR', 'SKIPPED', 'XFAIL', 'XPASS']);
/** Outcomes Terminal-Bench counts as a pass: the test ran as it meant to, or was meant to be left. */
export const PASSING_OUTCOMES: ReadonlySet<PytestOutcome> = new Set<PytestOutcome>([
  'PASSED',
  'XFAIL',
  'SKIPPED',
]);

/** One line of the summary: the test (its node id without the file) and its outcome. */
export interface PytestResult {
  test: string;
  outcome: PytestOutcome;
  passed: boolean;
}

/**
 * The tests of pytest's "short test summary info" section, as Terminal-Bench's pytest parser
 * reads it: lines after the section's header that start with an outcome, the test's node id
 * after it (a ` - message` cut off, the part after the file's `::` kept). Undefined when the
 * output has no such section (pytest did not run, or ran without `-rA`).
 */
export function parsePytestSummary(output: string): PytestResult[] | undefined {
  const lines = output.split('\n');
  const start = lines.findIndex((line) => /=+ short test summary info =+/.test(line));
  if (start < 0) return undefined;
  const results: PytestResult[] = [];
  for (const line of lines.slice(start + 1)) {
    const trimmed = line.trim();
    const space = trimmed.indexOf(' ');
    const outcome = space < 0 ? trimmed : trimmed.slice(0, space);
    if (!OUTCOMES.has(outcome)) continue;
    const nodeId = trimmed
      .slice(space + 1)
      .split(' - ')[0]!
      .trim();
    const test = nodeId.includes('::') ? nodeId.slice(nodeId.indexOf('::') + 2) : nodeId;
    results.push({
      test,
      outcome: outcome as PytestOutcome,
      passed: PASSING_OUTCOMES.has(outcome as PytestOutcome),
    });
  }
  return results;
}
