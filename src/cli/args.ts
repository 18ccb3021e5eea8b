import { open, rm, stat } from 'node:fs/promises';
import { totalmem } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { imageSourcesFromEnv, type ImageSources } from '../platform/index.ts';
import { LOG_LEVELS, createLogger, writeFileAtomic, type LogLevel, type Logger } from '../common/index.ts';
import type { OptionTable, ParsedCommandArgs } from './command-spec.ts';
import { UsageError } from './exit-codes.ts';

export type { ParsedCommandArgs } from './command-spec.ts';

/** This host's memory: no sandbox or node here can use more. */
export const HOST_MEMORY_MIB = Math.floor(totalmem() / 2 ** 20);

/** A number option's value (checked against its range when parsed), or undefined when absent. */
export function numberOf(parsed: ParsedCommandArgs, name: string): number | undefined {
  const value = parsed.values[name];
  return typeof value === 'number' ? value : undefined;
}

/** Whether a flag was given. */
export function flag(parsed: ParsedCommandArgs, name: string): boolean {
  return parsed.values[name] === true;
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
  'fallback-base': {
    type: 'string',
    value: 'ENV',
    description: 'build on ENV a FROM image that is neither in the store nor pulled',
  },
  'registry-auth': {
    type: 'string',
    value: 'FILE',
    description: 'registry credentials (docker config.json)',
  },
  'insecure-registry': {
    type: 'string',
    value: 'HOST',
    multiple: true,
    description: 'a registry spoken to over plain HTTP',
  },
} as const satisfies OptionTable;

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
  'task-env': {
    type: 'string',
    value: 'VAR',
    multiple: true,
    description: "a host variable that tasks' ${VAR} templates may read",
  },
} as const satisfies OptionTable;

/** The host variables tasks may read, as `--task-env` names them ($SANDGYM_TASK_ENV adds more). */
export function taskLoadOptions(parsed: ParsedCommandArgs): { taskEnv: string[] } {
  return { taskEnv: texts(parsed, 'task-env') };
}

/** The options of the long-running servers' logs (node agent, controller). */
export const LOG_OPTIONS = {
  'log-level': {
    type: 'string',
    value: 'LEVEL',
    description: `${LOG_LEVELS.join(', ')}; JSON lines on stderr (else $SANDGYM_LOG_LEVEL, else info)`,
  },
} as const satisfies OptionTable;

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

/**
 * A listen address, `HOST:PORT`, `[IPV6]:PORT` or `:PORT` (every address), checked here so a
 * typo is a usage error naming the flag rather than a failed bind; port 0 picks a free one.
 */
export function listenAddress(name: string, value: string): { host: string; port: number } {
  const match = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.-]*)):(\d{1,5})$/.exec(value);
  const port = Number(match?.[3]);
  if (!match || port > 65_535)
    throw new UsageError(
      `--${name} takes HOST:PORT, [IPV6]:PORT or :PORT (0 picks a free port), got "${value}"`,
    );
  return { host: match[1] ?? match[2] ?? '', port };
}

/** Where `--json [OUT]` sends its document. */
export interface JsonOutput {
  write(document: unknown): Promise<void>;
}

/**
 * A file the command will write when it is done, checked now, before the work: a probe file is
 * made and removed beside it (where the atomic write puts its temp file), so a missing folder,
 * a read-only mount or a kernel filesystem fails at once, naming the flag.
 */
export async function checkWritableFile(name: string, path: string): Promise<void> {
  const target = resolve(path);
  const probe = join(dirname(target), `.${basename(target)}.${process.pid}.probe`);
  if ((await stat(target).catch(() => undefined))?.isDirectory())
    throw new UsageError(`--${name} ${path} cannot be written: it is a folder`);
  try {
    await (await open(probe, 'wx')).close();
    await rm(probe, { force: true });
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'its folder does not exist' : `its folder cannot be written (${code})`;
    throw new UsageError(`--${name} ${path} cannot be written: ${why}`);
  }
}

/**
 * The command's `--json [OUT]` (JSON_OPTION): undefined without it; stdout (one line) without OUT
 * or with `-`; else the file OUT, written atomically and indented, checked writable now.
 */
export async function jsonOutput(parsed: ParsedCommandArgs): Promise<JsonOutput | undefined> {
  const out = text(parsed, 'json');
  if (out === undefined) return undefined;
  if (out === '-' || out === '')
    return {
      write: (document) => {
        console.log(JSON.stringify(document));
        return Promise.resolve();
      },
    };
  await checkWritableFile('json', out);
  return { write: (document) => writeFileAtomic(out, `${JSON.stringify(document, null, 2)}\n`) };
}
