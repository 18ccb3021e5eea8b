import type { Logger } from '../common/index.ts';

/** Progress for a person at a terminal: "sandgym: message (key value, ...)" lines on stderr. */
export function consoleLogger(bindings: Record<string, unknown> = {}): Logger {
  const write =
    (level: string) =>
    (object: Record<string, unknown>, message?: string): void => {
      const fields = Object.entries({ ...bindings, ...object })
        .filter(([key]) => key !== 'component')
        .map(([key, value]) => `${key} ${Array.isArray(value) ? value.join(',') : String(value)}`);
      const prefix = level === 'info' ? 'sandgym' : `sandgym ${level}`;
      console.error(`${prefix}: ${message ?? ''}${fields.length ? ` (${fields.join(', ')})` : ''}`);
    };
  return {
    debug: () => undefined,
    info: write('info'),
    warn: write('warning'),
    error: write('error'),
    child: (more) => consoleLogger({ ...bindings, ...more }),
  };
}
