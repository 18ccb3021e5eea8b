/** A test's outcome as a repository's own runner printed it, in SWE-bench's terms. */
export type LoggedStatus = 'passed' | 'failed' | 'error' | 'skipped';

/**
 * Django's runner (unittest at verbosity 2): `test_name (module.Class) ... ok`, or with Python
 * 3.11 `test_name (module.Class.test_name) ... ok`; a test with a docstring prints the docstring's
 * first line before ` ... `. Each test is recorded under the id as printed and under the other
 * form, so rows of either Django era find it.
 */
export function parseDjangoLog(log: string): Map<string, LoggedStatus> {
  const statuses = new Map<string, LoggedStatus>();
  const outcome = (word: string): LoggedStatus | undefined =>
    word === 'ok' || word === 'expected failure'
      ? 'passed'
      : word === 'FAIL' || word === 'unexpected success'
        ? 'failed'
        : word === 'ERROR'
          ? 'error'
          : word.startsWith('skipped')
            ? 'skipped'
            : undefined;
  const record = (name: string, where: string, status: LoggedStatus): void => {
    const className = where.endsWith(`.${name}`) ? where.slice(0, -name.length - 1) : where;
    statuses.set(`${name} (${className})`, status);
    statuses.set(`${name} (${className}.${name})`, status);
  };
  let pending: { name: string; where: string } | undefined;
  for (const line of log.split('\n')) {
    const full = /^(\w+) \(([\w.]+)\)(?:\s.*)? \.\.\. (.+)$/.exec(line);
    if (full) {
      const status = outcome(full[3]!.trim());
      if (status) record(full[1]!, full[2]!, status);
      pending = undefined;
      continue;
    }
    const head = /^(\w+) \(([\w.]+)\)$/.exec(line);
    if (head) {
      pending = { name: head[1]!, where: head[2]! };
      continue;
    }
    const tail = / \.\.\. (.+)$/.exec(line);
    if (tail && pending) {
      const status = outcome(tail[1]!.trim());
      if (status) record(pending.name, pending.where, status);
      pending = undefined;
    }
  }
  return statuses;
}

/**
 * sympy's bin/test at --verbose: `test_name ok`, or a one-letter outcome (`F` failed, `E` error,
 * `f` expected failure, `X` unexpected pass, `s`/`w` skipped), one test per line.
 */
export function parseSympyLog(log: string): Map<string, LoggedStatus> {
  const statuses = new Map<string, LoggedStatus>();
  const letters: Record<string, LoggedStatus> = {
    ok: 'passed',
    f: 'passed',
    F: 'failed',
    X: 'failed',
    E: 'error',
    s: 'skipped',
    w: 'skipped',
  };
  for (const line of log.split('\n')) {
    const match = /^(test_\w+)\s+(ok|F|E|f|X|s|w)\s*$/.exec(line.trim());
    if (match) statuses.set(match[1]!, letters[match[2]!]!);
  }
  return statuses;
}
