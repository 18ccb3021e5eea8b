import { pino } from 'pino';

type LogMethod = (object: Record<string, unknown>, message?: string) => void;

/** The logging surface library code uses. Components take a child: `logger.child({ component })`. */
export interface Logger {
  debug: LogMethod;
  info: LogMethod;
  warn: LogMethod;
  error: LogMethod;
  child(bindings: Record<string, unknown>): Logger;
}

/** Options for {@link createLogger}. */
export interface LoggerOptions {
  level?: 'debug' | 'info' | 'warn' | 'error' | 'silent';
}

/** A pino logger writing JSON lines to stderr, so stdout stays free for command output. */
export function createLogger(options: LoggerOptions = {}): Logger {
  const level = options.level ?? (process.env['SANDGYM_LOG_LEVEL'] as LoggerOptions['level']) ?? 'warn';
  return pino({ level, base: { app: 'sandgym' } }, pino.destination(2));
}

/** A logger that drops everything, the default for library callers that pass none. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
