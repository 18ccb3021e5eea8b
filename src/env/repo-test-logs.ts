/** A test's outcome as a repository's own runner printed it, in SWE-bench's terms. */
export type LoggedStatus = 'passed' | 'failed' | 'error' | 'skipped';

/**
 * Django's runner (unittest at verbosity 2): `test_name (module.Class) ... ok`, or with Python
 * 3.11 `test_name (module.Class.test_name) ... ok`; a test with a docstring prints the docstring's
 * first line, on a line of its own, before ` ... `. SWE-bench's rows name each test by what comes
 * before ` ... ` (so a docstring's line for such a test), as swebench's parse_log_django reads the
 * log: each test is recorded under that name. Those named `test_name (...)` are recorded under the
 * other era's form too, and a docstring's test under its name as well, so a row of either era finds
 * it. Only ok, skipped, FAIL and ERROR count, as there: an expected failure or unexpected success
 * names no status.
 */
export function parseDjangoLog(log: string): Map<string, LoggedStatus> {
  const statuses = new Map<string, LoggedStatus>();
  const record = (name: string, status: LoggedStatus): void => {
    statuses.set(name, status);
    const named = /^(\w+) \(([\w.]+)\)$/.exec(name);
    if (!named) return;
    const [, test, where] = named as unknown as [string, string, string];
    const className = where.endsWith(`.${test}`) ? where.slice(0, -test.length - 1) : where;
    for (const form of [`${test} (${className})`, `${test} (${className}.${test})`])
      if (!statuses.has(form) || form === name) statuses.set(form, status);
  };
  let previous: string | undefined;
  let head: string | undefined;
  for (const raw of log.split('\n')) {
    const line = raw.trim();
    if (line.includes('--version is equivalent to version'))
      record('--version is equivalent to version', 'passed');
    if (line.includes(' ... ')) previous = line.split(' ... ')[0];
    const status = / \.\.\. (ok|OK| OK)$/.test(line)
      ? 'passed'
      : line.includes(' ... skipped')
        ? 'skipped'
        : line.endsWith(' ... FAIL')
          ? 'failed'
          : line.endsWith(' ... ERROR')
            ? 'error'
            : undefined;
    if (status) {
      // where swebench cuts: a pass at its last " ... ", the others at their word's first
      const at = {
        passed: line.lastIndexOf(' ... '),
        skipped: line.indexOf(' ... skipped'),
        failed: line.indexOf(' ... FAIL'),
        error: line.indexOf(' ... ERROR'),
      }[status];
      const name = line.slice(0, at);
      record(name, status);
      // a docstring's line: the test it belongs to was named on the line before
      if (head && !/^\w+ \([\w.]+\)$/.test(name)) record(head, status);
    } else if (/^(FAIL|ERROR):/.test(line)) {
      record(line.split(/\s+/)[1] ?? '', line.startsWith('FAIL') ? 'failed' : 'error');
    } else if (line.startsWith('ok') && previous !== undefined) {
      // the test printed something between " ... " and its "ok"
      record(previous, 'passed');
    }
    head = /^\w+ \([\w.]+\)$/.test(line) ? line : undefined;
  }
  return statuses;
}

/**
 * sympy's bin/test at --verbose: `test_name ok`, `test_name F` (failed) or `test_name E` (error),
 * one test per line, and a failure's traceback headed `path.py:test_name`. Read as swebench's
 * parse_log_sympy reads it: other letters (an expected failure, a skip) name no status.
 */
export function parseSympyLog(log: string): Map<string, LoggedStatus> {
  const statuses = new Map<string, LoggedStatus>();
  for (const match of log.matchAll(/(_*) (.*)\.py:(.*) (_*)/g))
    statuses.set(`${match[2]}.py:${match[3]}`, 'failed');
  for (const raw of log.split('\n')) {
    const line = raw.trim();
    if (!line.startsWith('test_')) continue;
    const test = line.split(/\s+/)[0]!;
    if (line.endsWith(' E')) statuses.set(test, 'error');
    if (line.endsWith(' F')) statuses.set(test, 'failed');
    if (line.endsWith(' ok')) statuses.set(test, 'passed');
  }
  return statuses;
}
