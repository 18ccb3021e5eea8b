/** What pytest says of one test in its short test summary (`pytest -rA`). */
export type PytestOutcome = 'PASSED' | 'FAILED' | 'ERROR' | 'SKIPPED' | 'XFAIL' | 'XPASS';

const OUTCOMES = new Set<string>(['PASSED', 'FAILED', 'ERROR', 'SKIPPED', 'XFAIL', 'XPASS']);
/** Outcomes Terminal-Bench counts as a pass: the test ran as it meant to, or was meant to be left. */
export const PASSING_OUTCOMES: ReadonlySet<PytestOutcome> = new Set<PytestOutcome>([
  'PASSED',
  'XFAIL',
  'SKIPPED',
]);

/** One line of the summary: the test as Terminal-Bench names it, its node id and its outcome. */
export interface PytestResult {
  /**
   * The test as Terminal-Bench's parser names it: the text after the file's `::`, with a FAILED
   * line's message cut at its last ` - ` and other lines' kept (so `test_x - reason` for an XFAIL,
   * `[1] tests/t.py:9: reason` for a skip summed up by location).
   */
  test: string;
  /** The node id the line is about (`tests/t.py::test_x[a - b]`): what pytest's reporter calls it. */
  nodeId: string;
  outcome: PytestOutcome;
  passed: boolean;
}

/** Terminal-Bench reads a tmux capture, which holds the text without pytest's colours. */
// eslint-disable-next-line no-control-regex
const ANSI_ESCAPE = /\x1b\[[0-9;]*[A-Za-z]/g;
const SUMMARY_HEADER = /=+\s*short test summary info\s*=+/i;
/** The line ends of Python's str.splitlines, by which the harness splits. */
// eslint-disable-next-line no-control-regex
const LINE_END = /\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]/;

/**
 * The node id at the head of a summary line's text: up to the ` - ` that starts pytest's message,
 * the first one outside the brackets of a parametrized id (`test_x[a - b] - assert ...`).
 */
function nodeIdOf(text: string): string {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const char = text[i];
    if (char === '[') depth++;
    else if (char === ']') depth = Math.max(0, depth - 1);
    else if (depth === 0 && text.startsWith(' - ', i)) return text.slice(0, i);
  }
  return text;
}

/** A line's first word and the rest, trimmed: Python's `line.split(maxsplit=1)`. */
function splitFirstWord(line: string): [string, string] {
  const match = /^\s*(\S+)(?:\s+([\s\S]*?))?\s*$/.exec(line);
  return [match?.[1] ?? '', match?.[2] ?? ''];
}

/**
 * The tests of pytest's "short test summary info" section, read as Terminal-Bench's PytestParser
 * reads them (test/unit/harness-golden.test.ts holds the two together): every line after the
 * section's first header whose first word, a trailing `:` dropped, is an outcome. Undefined when
 * the output has no such section (pytest did not run, or all passed without `-rA`).
 */
export function parsePytestSummary(output: string): PytestResult[] | undefined {
  const text = output.replace(ANSI_ESCAPE, '');
  const header = SUMMARY_HEADER.exec(text);
  if (!header) return undefined;
  const results: PytestResult[] = [];
  for (const line of text.slice(header.index + header[0].length).split(LINE_END)) {
    // the harness cuts a FAILED line's message at its last " - ", and no other line's
    const cleaned =
      line.startsWith('FAILED') && line.includes(' - ') ? line.slice(0, line.lastIndexOf(' - ')) : line;
    const [word, named] = splitFirstWord(cleaned);
    const outcome = word.replace(/^:+|:+$/g, '');
    if (!OUTCOMES.has(outcome) || !named) continue;
    const test = named.includes('::') ? named.slice(named.indexOf('::') + 2) : named;
    if (!test) continue;
    results.push({
      test,
      nodeId: nodeIdOf(splitFirstWord(line)[1]),
      outcome: outcome as PytestOutcome,
      passed: PASSING_OUTCOMES.has(outcome as PytestOutcome),
    });
  }
  return results;
}

/**
 * Whether a summary resolves the task: it lists tests and every one passed. Terminal-Bench's
 * harness differs on purpose in two places (see the golden test): it resolves a summary listing
 * no test (`all([])`), and where a test is listed twice it keeps the last line only.
 */
export function summaryResolves(results: readonly PytestResult[] | undefined): boolean {
  return results !== undefined && results.length > 0 && results.every((r) => r.passed);
}
