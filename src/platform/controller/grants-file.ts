import { readFile } from 'node:fs/promises';
import { z } from 'zod';
import { SandgymError, messageOf, parseAt, type Logger } from '../../common/index.ts';
import type { ProjectGrant } from './controller.ts';

/** Shorter tokens are refused: a token is all a client shows to act for its project. */
const MIN_TOKEN_CHARS = 16;

const grantSchema = z.strictObject({
  project: z.string().regex(/^[a-z0-9][a-z0-9_-]{0,63}$/, 'project names are a-z, 0-9, _ and -'),
  maxSandboxes: z.number().int().positive(),
  // rule-book names, and host:/cidr: sets the project may name hosts, ranges and ports inside
  network: z.array(z.string()).default([]),
  /** Bytes of request bodies the project's calls may hold at once on each controller. */
  maxInFlightBytes: z.number().int().positive().optional(),
  /** Bytes the project may hold in the layer store; the nodes' own quota without. */
  maxStoreBytes: z.number().int().positive().optional(),
});

const fileSchema = z.strictObject({ tokens: z.record(z.string(), z.unknown()) });

/**
 * The grants of a controller's `--grants` file, validated. A mistake names the file and the
 * field, and a token by its place in the file (and its project), never by itself: the message
 * goes to logs, and a token there is a project's key.
 */
export async function readGrantsFile(file: string): Promise<Record<string, ProjectGrant>> {
  let raw: string;
  try {
    raw = await readFile(file, 'utf8');
  } catch (error) {
    throw new SandgymError('invalid_argument', `Cannot read the grants file ${file}: ${messageOf(error)}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (error) {
    throw new SandgymError('invalid_argument', `The grants file ${file} is not JSON: ${messageOf(error)}`);
  }
  const { tokens } = parseAt(fileSchema, json, `grants file ${file}`);
  const grants: Record<string, ProjectGrant> = {};
  Object.entries(tokens).forEach(([token, grant], index) => {
    const project = (grant as { project?: unknown } | null)?.project;
    const which = `token #${index + 1}${typeof project === 'string' ? ` (project ${project.slice(0, 64)})` : ''}`;
    if (token.length < MIN_TOKEN_CHARS) {
      throw new SandgymError(
        'invalid_argument',
        `Invalid grants file ${file}: ${which} is shorter than ${MIN_TOKEN_CHARS} characters`,
      );
    }
    grants[token] = parseAt(grantSchema, grant, `grants file ${file}, tokens.${which}`);
  });
  return grants;
}

/**
 * Reads the grants file again whenever the process gets SIGHUP, and hands the grants to `apply`
 * (which checks them as a whole and throws when they do not hold together). A file that fails
 * either way leaves the grants as they were, and the error in the log. Returns what stops it.
 */
export function reloadGrantsOnHangup(
  file: string,
  apply: (grants: Record<string, ProjectGrant>) => void,
  logger: Logger,
): () => void {
  // one reload at a time, in the order the signals came, so the last file read is the one kept
  let reloading = Promise.resolve();
  const reload = (): void => {
    reloading = reloading.then(async () => {
      try {
        const grants = await readGrantsFile(file);
        apply(grants);
        logger.info({ file, tokens: Object.keys(grants).length }, 'grants reloaded');
      } catch (error) {
        logger.error({ file, error: messageOf(error) }, 'grants not reloaded: the old ones stay');
      }
    });
  };
  process.on('SIGHUP', reload);
  return () => process.off('SIGHUP', reload);
}
