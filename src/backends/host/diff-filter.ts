import { Buffer } from 'node:buffer';
import { lstat, mkdir, readdir, rename } from 'node:fs/promises';
import { join } from 'node:path';

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
}

/** Why an entry did not make it into the layer. */
export type DropReason =
  'excluded' | 'replaces_an_excluded_folder' | 'special_file' | 'name_too_long' | 'path_too_long';

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
}

/** The longest name a layer image holds (mkfs.erofs 1.5 refuses 255-byte names). */
const MAX_NAME_BYTES = 254;
/**
 * Paths mkfs.erofs walks must stay under PATH_MAX (4096), and so must every path this filter
 * renames: an entry longer than this, with room for one more name below it, is taken out whole.
 */
const MAX_PATH_BYTES = 4095 - (MAX_NAME_BYTES + 2);
/** An overlay whiteout: a character device 0:0, which marks a deletion and is kept. */
const WHITEOUT_RDEV = 0;

/**
 * Prunes a private copy of a writable layer (a snapshot nobody else writes) so that it packs, and
 * packs only what it should: excluded paths and what stands in for them, FIFOs, sockets and device
 * nodes (nothing a grader or a restore should meet, and what a planted FIFO would make hang), and
 * names or paths too long for a layer image. Nothing is deleted in place: each entry is renamed
 * into `trash` (outside `tree`, on the same filesystem), which costs one rename whatever it holds
 * and works at any depth; the caller discards the whole copy afterwards. No symlink is followed.
 * `clearOpaque` removes the opaque mark of the folders it is given and returns those that had it.
 */
export async function filterDiffTree(
  tree: string,
  trash: string,
  filter: DiffFilter,
  clearOpaque: (dirs: string[]) => Promise<string[]>,
): Promise<FilterReport> {
  await mkdir(trash, { recursive: true });
  let trashed = 0;
  const discard = (rel: string): Promise<void> => rename(join(tree, rel), join(trash, String(trashed++)));
  const dropped: FilterReport['dropped'] = [];
  const present = new Set<string>();
  for (const path of filter.reportPaths ?? []) if (await touches(tree, path)) present.add(path);

  // excluded paths, top down, so no check ever goes through a symlink
  const opaqueCandidates = new Map<string, string[]>();
  for (const path of filter.excludePaths ?? []) {
    const parts = components(path);
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
        dropped.push({ path: rel, reason: 'replaces_an_excluded_folder' });
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
  const pending: string[] = [''];
  while (pending.length > 0) {
    const dir = pending.pop() ?? '';
    for (const entry of await readdir(join(tree, dir), { withFileTypes: true })) {
      const rel = dir ? `${dir}/${entry.name}` : entry.name;
      let reason: Exclude<DropReason, 'excluded'> | undefined;
      if (Buffer.byteLength(entry.name) > MAX_NAME_BYTES) reason = 'name_too_long';
      else if (rootBytes + Buffer.byteLength(rel) > MAX_PATH_BYTES) reason = 'path_too_long';
      else if (entry.isFIFO() || entry.isSocket() || entry.isBlockDevice()) reason = 'special_file';
      else if (entry.isCharacterDevice() && (await lstat(join(tree, rel))).rdev !== WHITEOUT_RDEV)
        reason = 'special_file';
      if (reason) {
        await discard(rel);
        dropped.push({ path: rel, reason });
      } else if (entry.isDirectory()) {
        pending.push(rel);
      }
    }
  }
  return { present: [...present], dropped };
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
