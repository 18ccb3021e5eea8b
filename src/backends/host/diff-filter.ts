import { Buffer } from 'node:buffer';
import type { Dirent } from 'node:fs';
import { lstat, mkdir, readdir, rename } from 'node:fs/promises';
import { join } from 'node:path';
import { SandgymError, climbsOut } from '../../common/index.ts';
import { resolveInRoot } from './resolve-in-root.ts';

/**
 * What to take out of a sandbox's writable layer before it becomes a layer (a grader's diff, a
 * checkpoint). Paths are relative to the sandbox's root, without a leading slash.
 */
export interface DiffFilter {
  /**
   * Left out with everything below them. So is any ancestor of one that is not a plain folder in
   * the diff (a symlink, a file, a deletion): a symlink in place of /usr/local would otherwise
   * carry a forged /usr/local/bin past the exclusion. An ancestor the sandbox emptied and made
   * again (an opaque folder) is made transparent, so the layers below show through it again.
   */
  excludePaths?: readonly string[];
  /** Paths whose presence in the diff is reported: written, deleted, or replaced through an ancestor. */
  reportPaths?: readonly string[];
  /**
   * Regular expressions over paths (relative to the root): matching entries are left out with
   * everything below them, before links are resolved (see {@link hiddenPaths}).
   */
  excludeRegexes?: readonly string[];
  /**
   * Folders only a grader holds (tests, solutions, logs): a symlink of the diff that leads into
   * one, resolved as the sandbox would resolve it over the layers below, is left out, so a test
   * that compares the agent's file with its hidden expected one never compares that file with
   * itself. So is a link through a process's magic links in /proc (`/proc/self/root/tests`).
   */
  hiddenPaths?: readonly string[];
}

/** Why an entry did not make it into the layer. */
export type DropReason =
  | 'excluded'
  | 'replaces_an_excluded_folder'
  | 'special_file'
  | 'name_too_long'
  | 'path_too_long'
  | 'name_not_utf8'
  | 'links_into_hidden';

/** An entry taken out of a diff (excluded paths themselves are not listed). */
export interface DroppedEntry {
  path: string;
  reason: Exclude<DropReason, 'excluded'>;
}

/** What {@link filterDiffTree} found and did. */
export interface FilterReport {
  /** The report paths the diff touches. */
  present: string[];
  dropped: DroppedEntry[];
  /**
   * What an exclusion pattern took out (start-up hooks, caches, modules that would shadow the
   * harness), at most {@link MAX_LISTED}: what grading in the agent's own sandbox must
   * remove there, since no packing keeps it from the tests.
   */
  excludedByPattern: string[];
}

/**
 * How many pattern-excluded paths, and how many dropped entries, a report lists: a diff with
 * more is the agent's flood (each FIFO or link costs it one inode), which must not become an
 * episode report of millions of entries.
 */
export const MAX_LISTED = 10_000;

/** The longest name a layer image holds (mkfs.erofs 1.5 refuses 255-byte names). */
const MAX_NAME_BYTES = 254;
/**
 * Paths mkfs.erofs walks must stay under PATH_MAX (4096), and so must every path this filter
 * renames: an entry longer than this, with room for one more name below it, is taken out whole.
 */
const MAX_PATH_BYTES = 4095 - (MAX_NAME_BYTES + 2);
/** An overlay whiteout: a character device 0:0, which marks a deletion and is kept. */
const WHITEOUT_RDEV = 0;

/** What {@link filterDiffTree} works on: a private copy of a writable layer, and what it can do there. */
export interface DiffTree {
  tree: string;
  /** A folder beside it, on the same filesystem, where pruned entries go. */
  trash: string;
  /** Removes the opaque mark of the folders it is given; returns those that had one. */
  clearOpaque(dirs: string[]): Promise<string[]>;
  /**
   * Hands `consume` the tree as the sandbox sees it (the copy over the sandbox's layers), read
   * only; where the layers cannot be had, the copy alone.
   */
  withMergedView<T>(consume: (root: string) => Promise<T>): Promise<T>;
}

/**
 * Prunes a private copy of a writable layer (a snapshot nobody else writes) so that it packs, and
 * packs only what it should: excluded paths and what stands in for them, FIFOs, sockets and device
 * nodes (nothing a grader or a restore should meet, and what a planted FIFO would make hang), names
 * or paths too long for a layer image, and links into hidden paths. Nothing is deleted in place:
 * each entry is renamed into `trash` (outside `tree`, on the same filesystem), which costs one
 * rename whatever it holds and works at any depth; the caller discards the whole copy afterwards.
 * No symlink is followed.
 *
 * What is kept may hold at most `maxApparentBytes` of files by their apparent size (see
 * {@link ApparentSize}), or the diff is refused with a `resource_exhausted` that is not
 * retryable: the sandbox's own disk cap, so sparse files cannot make a packer or a grader read
 * (and compress) far more than the sandbox could ever have written.
 */
export async function filterDiffTree(
  copy: DiffTree,
  filter: DiffFilter,
  maxApparentBytes = Infinity,
): Promise<FilterReport> {
  const { tree, trash } = copy;
  const apparent = new ApparentSize(maxApparentBytes);
  // every path is joined to the copy: one that climbs out would name a folder of the host's
  for (const path of [...(filter.excludePaths ?? []), ...(filter.reportPaths ?? [])])
    if (climbsOut(path))
      throw new SandgymError('invalid_argument', `Diff path "${path}" must not contain a ".." component`);
  const excluded = (filter.excludeRegexes ?? []).map(compileExclusion);
  const clearOpaque = (dirs: string[]) => copy.clearOpaque(dirs);
  await mkdir(trash, { recursive: true });
  let trashed = 0;
  const discard = (rel: string): Promise<void> => rename(join(tree, rel), join(trash, String(trashed++)));
  const dropped: FilterReport['dropped'] = [];
  const drop = (entry: DroppedEntry): void => void (dropped.length < MAX_LISTED && dropped.push(entry));
  const excludedByPattern: string[] = [];
  const present = new Set<string>();
  // the copy is private and still: a path whose first name the tree lacks is not there, which
  // spares a lookup for each of the few dozen report and exclude paths a diff mostly never touches
  const topNames = new Set(await readdir(tree));
  const mayBeThere = (parts: string[]): boolean => parts.length > 0 && topNames.has(parts[0]!);
  const reported = filter.reportPaths ?? [];
  // read only, so looked up all at once
  const touched = await Promise.all(
    reported.map(async (path) => mayBeThere(components(path)) && (await touches(tree, path))),
  );
  reported.forEach((path, i) => touched[i] && present.add(path));

  // excluded paths, top down, so no check ever goes through a symlink
  const opaqueCandidates = new Map<string, string[]>();
  for (const path of filter.excludePaths ?? []) {
    const parts = components(path);
    if (!mayBeThere(parts)) continue;
    for (let depth = 1; depth <= parts.length; depth++) {
      const rel = parts.slice(0, depth).join('/');
      const info = await lstat(join(tree, rel)).catch(() => undefined);
      if (!info) break;
      if (depth === parts.length) {
        await discard(rel);
        break;
      }
      if (!info.isDirectory()) {
        await discard(rel);
        drop({ path: rel, reason: 'replaces_an_excluded_folder' });
        break;
      }
      opaqueCandidates.set(rel, [...(opaqueCandidates.get(rel) ?? []), path]);
    }
  }
  // an opaque ancestor hid what the layers below held under it: that touches those paths too
  const made = [...opaqueCandidates.keys()];
  for (const dir of await clearOpaque(made.map((rel) => join(tree, rel)))) {
    const rel = made[made.findIndex((candidate) => join(tree, candidate) === dir)] ?? '';
    for (const path of filter.reportPaths ?? []) if (isWithin(path, rel)) present.add(path);
  }

  // then everything else that cannot or should not be packed, in one walk
  const rootBytes = Buffer.byteLength(tree) + 1;
  const links: string[] = [];
  const pending: string[] = [''];
  while (pending.length > 0) {
    const dir = pending.pop() ?? '';
    for (const entry of await namedEntries(join(tree, dir))) {
      const rel = dir ? `${dir}/${entry.name}` : entry.name;
      if (!entry.isUtf8) {
        // no path string names it again: moved away by its bytes, and reported readably
        await rename(
          Buffer.concat([Buffer.from(`${join(tree, dir)}/`), entry.bytes]),
          join(trash, String(trashed++)),
        );
        drop({ path: rel, reason: 'name_not_utf8' });
        continue;
      }
      let reason: Exclude<DropReason, 'excluded'> | undefined;
      if (excluded.some((regex) => regex.test(rel))) {
        await discard(rel); // left out as asked, so not reported as dropped
        if (excludedByPattern.length < MAX_LISTED) excludedByPattern.push(rel);
        continue;
      }
      if (Buffer.byteLength(entry.name) > MAX_NAME_BYTES) reason = 'name_too_long';
      else if (rootBytes + Buffer.byteLength(rel) > MAX_PATH_BYTES) reason = 'path_too_long';
      else if (entry.isFIFO() || entry.isSocket() || entry.isBlockDevice()) reason = 'special_file';
      else if (entry.isCharacterDevice() && (await lstat(join(tree, rel))).rdev !== WHITEOUT_RDEV)
        reason = 'special_file';
      if (reason) {
        await discard(rel);
        drop({ path: rel, reason });
      } else if (entry.isDirectory()) {
        pending.push(rel);
      } else if (entry.isSymbolicLink()) {
        links.push(rel);
      } else if (entry.isFile()) {
        apparent.add(await lstat(join(tree, rel)));
      }
    }
  }
  const hidden = filter.hiddenPaths ?? [];
  if (hidden.length && links.length) {
    // resolved while the view is mounted, pruned after, so no lower of a mounted overlay changes
    const leaking = await copy.withMergedView(async (root) => {
      const found: string[] = [];
      for (const rel of links) {
        const target = await resolveInRoot(root, `/${rel}`);
        if (target === undefined || leadsInto(target, hidden)) found.push(rel);
      }
      return found;
    });
    for (const rel of leaking) {
      await discard(rel);
      drop({ path: rel, reason: 'links_into_hidden' });
    }
  }
  return { present: [...present], dropped, excludedByPattern };
}

/**
 * A quantified group that itself holds a quantifier (`(a+)+`, `(x*y)*`): what makes a backtracking
 * matcher take exponential time on a long path. Exclusions may come from a tenant.
 */
const NESTED_QUANTIFIER = /\([^()]*[*+}][^()]*\)[*+{]/;

/** An exclusion pattern as a regular expression, refused when it could backtrack without end. */
function compileExclusion(pattern: string): RegExp {
  if (pattern.length > 16_384 || NESTED_QUANTIFIER.test(pattern))
    throw new SandgymError(
      'invalid_argument',
      `Exclusion pattern ${JSON.stringify(pattern.slice(0, 80))} is too long or quantifies a quantified group: simplify it`,
    );
  try {
    return new RegExp(pattern);
  } catch (error) {
    throw new SandgymError(
      'invalid_argument',
      `Exclusion pattern ${JSON.stringify(pattern.slice(0, 80))} is not a regular expression`,
      {
        cause: error,
      },
    );
  }
}

/** A folder's entries with their names' bytes: names that are not UTF-8 cannot be joined as text. */
async function namedEntries(dir: string): Promise<(Dirent & { bytes: Buffer; isUtf8: boolean })[]> {
  const entries = (await readdir(Buffer.from(dir), {
    withFileTypes: true,
    encoding: 'buffer',
  })) as unknown as Dirent<Buffer>[];
  return entries.map((entry) => {
    const bytes = entry.name;
    const name = bytes.toString('utf8');
    return Object.assign(entry as unknown as Dirent, {
      name,
      bytes,
      isUtf8: Buffer.from(name, 'utf8').equals(bytes),
    });
  });
}

/** Magic links of /proc that lead to another root or to open files, wherever they are. */
const MAGIC_LINK = /^\/proc\/[^/]+\/(task\/[^/]+\/)?(root|cwd|fd|map_files)(\/|$)/;

/** Whether a resolved path is in a hidden folder, or goes on through a magic link. */
function leadsInto(target: string, hidden: readonly string[]): boolean {
  if (MAGIC_LINK.test(target) || target.startsWith('/dev/fd/') || target === '/dev/fd') return true;
  return hidden.some((path) => isWithin(components(target).join('/'), components(path).join('/')));
}

/**
 * The apparent size of a tree's files: what their sizes say, holes included, which is what
 * reading them (packing a layer, a grader's tests) costs. A file with several hard links counts
 * once: a layer holds it once. Past the cap, counting stops with the refusal.
 */
class ApparentSize {
  private bytes = 0;
  private readonly linked = new Set<number>();

  constructor(private readonly capBytes: number) {}

  add(file: { size: number; ino: number; nlink: number }): void {
    if (file.nlink > 1) {
      if (this.linked.has(file.ino)) return;
      this.linked.add(file.ino);
    }
    this.bytes += file.size;
    if (this.bytes <= this.capBytes) return;
    throw new SandgymError(
      'resource_exhausted',
      `The sandbox's changes hold more than its disk cap of ${mib(this.capBytes)} in files, by their apparent size (a sparse file counts whole, a hard-linked one once): a diff holds no more than its sandbox may write. Remove large or sparse files, or give the sandbox more disk (resources.diskMib)`,
    );
  }
}

function mib(bytes: number): string {
  return `${Math.floor(bytes / 2 ** 20)} MiB`;
}

function components(path: string): string[] {
  return path.split('/').filter((part) => part !== '' && part !== '.');
}

function isWithin(path: string, folder: string): boolean {
  return path === folder || path.startsWith(`${folder}/`);
}

/** Whether the diff holds `path` itself, or replaced a folder above it with something else. */
async function touches(tree: string, path: string): Promise<boolean> {
  const parts = components(path);
  for (let depth = 1; depth <= parts.length; depth++) {
    const info = await lstat(join(tree, parts.slice(0, depth).join('/'))).catch(() => undefined);
    if (!info) return false;
    if (depth === parts.length || !info.isDirectory()) return true;
  }
  return false;
}
