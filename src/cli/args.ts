import { parseArgs, type ParseArgsConfig } from 'node:util';
import { imageSourcesFromEnv, type ImageSources } from '../platform/index.ts';
import { LOG_LEVELS, createLogger, type LogLevel, type Logger } from '../common/index.ts';
import { UsageError } from './exit-codes.ts';

type Options = NonNullable<ParseArgsConfig['options']>;

/** Parsed options and positionals of one subcommand. */
export interface ParsedCommandArgs {
  values: Record<string, string | boolean | string[] | undefined>;
  positionals: string[];
}

/** Parses a subcommand's arguments strictly; anything unknown is a usage error naming it. */
export function parseCommandArgs(command: string, args: string[], options: Options): ParsedCommandArgs {
  try {
    const parsed = parseArgs({ args, options, strict: true, allowPositionals: true });
    return { values: parsed.values as ParsedCommandArgs['values'], positionals: parsed.positionals };
  } catch (error) {
    throw new UsageError(`sandgym ${command}: ${(error as Error).message}`);
  }
}

/** Splits arguments at the first "--": options before it, a command after it. */
export function splitAtDoubleDash(args: string[]): { before: string[]; after: string[] } {
  const at = args.indexOf('--');
  return at < 0 ? { before: args, after: [] } : { before: args.slice(0, at), after: args.slice(at + 1) };
}

/** Reads a positive integer option, or undefined when absent. */
export function positiveInt(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0)
    throw new UsageError(`--${name} must be a positive integer, got "${value}"`);
  return n;
}

export function nonNegativeInt(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0)
    throw new UsageError(`--${name} must be a whole number (0 or more), got "${value}"`);
  return n;
}

/** A string option's value, or undefined when absent. */
export function text(parsed: ParsedCommandArgs, name: string): string | undefined {
  const value = parsed.values[name];
  return typeof value === 'string' ? value : undefined;
}

/** A repeatable string option's values (`--build-arg A=1 --build-arg B=2`), none when absent. */
export function texts(parsed: ParsedCommandArgs, name: string): string[] {
  const value = parsed.values[name];
  return Array.isArray(value) ? value : typeof value === 'string' ? [value] : [];
}

/** Options of the commands that build task environments: where FROM images come from. */
export const IMAGE_SOURCE_OPTIONS = {
  'fallback-base': { type: 'string' },
  'registry-auth': { type: 'string' },
  'insecure-registry': { type: 'string', multiple: true },
} as const satisfies Options;

/**
 * The platform's image sources: the environment's ($SANDGYM_FALLBACK_BASE and the like), with
 * `--fallback-base ENV`, `--registry-auth FILE` and `--insecure-registry HOST` over them.
 */
export function imageSources(parsed: ParsedCommandArgs): ImageSources {
  return imageSourcesFromEnv({
    authFile: text(parsed, 'registry-auth'),
    insecureRegistries: texts(parsed, 'insecure-registry'),
    fallbackBase: text(parsed, 'fallback-base'),
  });
}

/** How task files are read: `--task-env VAR` lets `${VAR}` templates read the host's VAR. */
export const TASK_LOAD_OPTIONS = {
  'task-env': { type: 'string', multiple: true },
} as const satisfies Options;

/** The host variables tasks may read, as `--task-env` names them ($SANDGYM_TASK_ENV adds more). */
export function taskLoadOptions(parsed: ParsedCommandArgs): { taskEnv: string[] } {
  return { taskEnv: texts(parsed, 'task-env') };
}

/** The options of the long-running servers' logs (node agent, controller). */
export const LOG_OPTIONS = {
  'log-level': { type: 'string' },
} as const;

/**
 * The logger of a server command: pino JSON lines on stderr (coloured human lines when stderr
 * is a terminal), at --log-level, else $SANDGYM_LOG_LEVEL, else `info`.
 */
export function serverLogger(parsed: ParsedCommandArgs, role: string): Logger {
  const given = text(parsed, 'log-level') ?? process.env['SANDGYM_LOG_LEVEL'] ?? 'info';
  if (!(LOG_LEVELS as readonly string[]).includes(given)) {
    throw new UsageError(`--log-level must be one of ${LOG_LEVELS.join(', ')}, got "${given}"`);
  }
  return createLogger({ level: given as LogLevel, base: { role } });
}

const DURATION_UNITS_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** A duration option: `500ms`, `30s`, `15m`, `12h`, `7d`, or a bare number of milliseconds. */
export function durationMs(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(value.trim());
  const ms = match ? Number(match[1]) * (DURATION_UNITS_MS[match[2] ?? 'ms'] ?? 1) : NaN;
  if (!(ms > 0) || !Number.isFinite(ms))
    throw new UsageError(`--${name} must be a duration such as 30m, 12h or 7d, got "${value}"`);
  return Math.round(ms);
}
