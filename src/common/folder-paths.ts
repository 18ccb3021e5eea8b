import { constants } from 'node:fs';
import { lstat, open, readlink, realpath } from 'node:fs/promises';
import { isAbsolute, join, relative, sep } from 'node:path';
import { SandgymError } from './errors.ts';

const { O_RDONLY, O_NOFOLLOW, O_NONBLOCK } = constants;
/** As the kernel's MAXSYMLINKS: a chain of links longer than this is a loop. */
const MAX_LINK_HOPS = 40;
/** The most of one configuration file (a Dockerfile, task.toml, a compose file) ever read. */
const MAX_FOLDER_FILE_BYTES = 16 * 2 ** 20;

function errnoOf(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException | undefined)?.code;
}

/** Whether a path made by `relative` climbs out of the folder it is relative to. */
function leaves(rel: string): boolean {
  return rel === '..' || rel.startsWith(`..${sep}`) || isAbsolute(rel);
}

function names(path: string): string[] {
  return path.split('/').filter((name) => name !== '' && name !== '.');
}

/**
 * Where `path` (relative to `root`, or absolute and below it) leads, with every symlink on the
 * way resolved, refused when it leaves `root`: by `..`, by an absolute path, or through a link
 * whose target (relative or absolute) lies outside. This is the one way a path that someone
 * else wrote (a task's compose `build.context`, its Dockerfile, a `.dockerignore`, a SWE-bench
 * row's repository) is turned into a host path. From the first component that does not exist the
 * rest is taken as written, so the caller reports a missing file as missing. The refusal names
 * `path` as given and `what` it is, never where a link pointed: that is someone's host.
 */
export async function resolveBeneath(root: string, path: string, what: string): Promise<string> {
  const realRoot = await realpath(root);
  const outside = (): never => {
    throw new SandgymError(
      'invalid_argument',
      `${what} "${path}" is outside ${root}: it may name only files inside it (a symlink may not lead out)`,
    );
  };
  if (path.includes('\0')) outside();
  let pending: string[];
  if (isAbsolute(path)) {
    // an absolute path is accepted only as a spelling of a path below the root
    // (taken textually: `..` in the rest is resolved below, after the links before it)
    const base = [root, realRoot].find((r) => path === r || path.startsWith(r.endsWith('/') ? r : `${r}/`));
    if (base === undefined) return outside();
    pending = names(path.slice(base.length));
  } else pending = names(path);
  const resolved: string[] = [];
  let hops = 0;
  while (pending.length > 0) {
    const name = pending.shift()!;
    if (name === '..') {
      if (resolved.length === 0) outside();
      resolved.pop();
      continue;
    }
    const here = join(realRoot, ...resolved, name);
    const stats = await lstat(here).catch((error: unknown) => {
      if (['ENOENT', 'ENOTDIR'].includes(errnoOf(error) ?? '')) return undefined;
      throw error;
    });
    if (stats?.isSymbolicLink()) {
      if (++hops > MAX_LINK_HOPS) outside();
      const target = await readlink(here);
      if (isAbsolute(target)) {
        const rel = relative(realRoot, target);
        if (leaves(rel)) outside();
        resolved.length = 0;
        pending = [...names(rel), ...pending];
      } else pending = [...names(target), ...pending];
      continue;
    }
    resolved.push(name);
    if (!stats || !stats.isDirectory()) {
      // nothing exists below a missing entry or a file: the rest is as written
      for (const next of pending) {
        if (next === '..') {
          if (resolved.length === 0) outside();
          resolved.pop();
        } else resolved.push(next);
      }
      break;
    }
  }
  return join(realRoot, ...resolved);
}

/**
 * A regular file's bytes, opened `O_NOFOLLOW | O_NONBLOCK` and checked on its descriptor, so a
 * FIFO, a device, a folder or a symlink put in its place is refused at once (a FIFO would stall
 * the reader for ever) and a file larger than `maxBytes` is refused unread. Errors name `what`.
 * Undefined when the file does not exist and `missing` is `'undefined'`.
 */
export async function readRegularFile(
  path: string,
  what: string,
  options: { maxBytes?: number; missing?: 'error' | 'undefined' } = {},
): Promise<Buffer | undefined> {
  const maxBytes = options.maxBytes ?? MAX_FOLDER_FILE_BYTES;
  const refuse = (why: string): never => {
    throw new SandgymError('invalid_argument', `${what} ${why}`);
  };
  const file = await open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK).catch((error: unknown) => {
    const code = errnoOf(error);
    if (code === 'ENOENT' || code === 'ENOTDIR')
      return options.missing === 'undefined' ? undefined : refuse('does not exist');
    if (code === 'ELOOP') return refuse('is a symlink');
    if (code === 'EISDIR') return refuse('is a folder, not a file');
    return refuse(`cannot be read (${code ?? 'error'})`);
  });
  if (!file) return undefined;
  try {
    const stats = await file.stat();
    if (!stats.isFile()) refuse('is not a regular file');
    if (stats.size > maxBytes) refuse(`is larger than ${Math.round(maxBytes / 2 ** 20)} MiB`);
    return await file.readFile();
  } finally {
    await file.close();
  }
}

/**
 * A file below `root` (see {@link resolveBeneath}) read as UTF-8 text (see
 * {@link readRegularFile}); `what` names it in errors.
 */
export async function readTextBeneath(root: string, path: string, what: string): Promise<string> {
  return (await readRegularFile(await resolveBeneath(root, path, what), what))!.toString('utf8');
}
