import { pino } from 'pino';
import { PinoPretty } from 'pino-pretty';

type LogMethod = (object: Record<string, unknown>, message?: string) => void;

/** The logging surface library code uses. Components take a child: `logger.child({ component })`. */
export interface Logger {
  debug: LogMethod;
  info: LogMethod;
  warn: LogMethod;
  error: LogMethod;
  child(bindings: Record<string, unknown>): Logger;
}

/** How much a logger writes, least first; `silent` writes nothing. */
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error', 'silent'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Options for {@link createLogger}. */
export interface LoggerOptions {
  /** @default $SANDGYM_LOG_LEVEL, else `warn` */
  level?: LogLevel;
  /** Human lines instead of JSON. @default whether stderr is a terminal */
  pretty?: boolean;
  /** Fields on every line, e.g. `{ role: 'node', node: 'n1' }`. */
  base?: Record<string, unknown>;
}

/**
 * A pino logger on stderr, so stdout stays free for command output: one JSON object per line
 * for log collectors, or coloured human lines when a person watches the terminal.
 */
export function createLogger(options: LoggerOptions = {}): Logger {
  const level = options.level ?? (process.env['SANDGYM_LOG_LEVEL'] as LogLevel | undefined) ?? 'warn';
  const settings = { level, base: { app: 'sandgym', ...options.base } };
  if (options.pretty ?? process.stderr.isTTY) {
    return pino(settings, PinoPretty({ destination: 2, sync: true, ignore: 'app,pid,hostname' }));
  }
  return pino(settings, pino.destination(2));
}

/** A logger that drops everything, the default for library callers that pass none. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
