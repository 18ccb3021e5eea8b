/**
 * Named points where a test may have this process die at once (SIGKILL, no clean-up), to prove
 * that what was promised survives a crash at exactly that point. Armed only by the environment
 * variable SANDGYM_FAULT_POINTS, which no production set-up sets: a comma-separated list of
 * names, each with an optional `@N` to die the Nth time the point is reached (default the first).
 * Unarmed, a point costs one map lookup.
 */
const armed = new Map<string, number>();
for (const entry of (process.env['SANDGYM_FAULT_POINTS'] ?? '').split(',')) {
  const [name = '', nth = '1'] = entry.trim().split('@');
  if (name) armed.set(name, Math.max(1, Number(nth) || 1));
}

/** The process dies here if the point is armed and this is its turn. */
export function faultPoint(name: string): void {
  const left = armed.get(name);
  if (left === undefined) return;
  if (left > 1) armed.set(name, left - 1);
  else process.kill(process.pid, 'SIGKILL');
}
