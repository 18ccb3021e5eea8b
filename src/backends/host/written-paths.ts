import { constants } from 'node:fs';
import { open, readdir, type FileHandle } from 'node:fs/promises';
import { posix } from 'node:path';

/** A folder opened so that a symlink, or anything but a folder, in its place fails the open. */
const FOLDER_FLAGS = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;

/**
 * Opens the folder `name` of a held folder, through the held fd: a symlink swapped in where it
 * was (the sandbox runs on while it is looked at) makes the open fail; it is never followed.
 * Undefined when it is not a folder (a file, a link, a whiteout) or is gone.
 */
async function openFolder(parent: FileHandle | string, name?: string): Promise<FileHandle | undefined> {
  const path = typeof parent === 'string' ? parent : `/proc/self/fd/${parent.fd}/${name ?? ''}`;
  return open(path, FOLDER_FLAGS).catch(() => undefined);
}

/** Python's bytecode cache folders, which no audit counts (see {@link writtenUnder}). */
const BYTECODE_CACHE = '__pycache__';

/**
 * What an overlay upper dir holds under each of `prefixes` (absolute paths inside the sandbox):
 * its files, symlinks, whiteouts (deletions) and empty folders, as sandbox paths, at most `limit`.
 * The upper dir belongs to a sandbox that may be running, so nothing in it is followed: the walk
 * holds each folder open and opens the next through it, refusing anything that is not a folder
 * (a link or a file where a folder should be is reported, not entered), so a swap under the walk
 * can never lead it out of the upper dir. Python's bytecode caches (`__pycache__`) are not
 * counted: any interpreter that runs writes them, and no grader takes them from a diff.
 */
export async function writtenUnder(
  upper: string,
  prefixes: readonly string[],
  limit: number,
): Promise<string[]> {
  const found = new Set<string>();
  const add = (path: string): boolean => {
    if (found.size < limit) found.add(path);
    return found.size < limit;
  };
  const root = await openFolder(upper);
  if (!root) return [];
  try {
    await walkPrefixes(root, '', prefixTree(prefixes), add);
  } finally {
    await root.close();
  }
  return [...found].sort();
}

/**
 * The prefixes as a tree of their names: a node that ends a prefix takes everything below it.
 * Steps are audited after every call against a few dozen prefixes, most of which the sandbox never
 * wrote under: one listing per folder the prefixes share, instead of a lookup per prefix, keeps
 * that cheap.
 */
interface PrefixNode {
  whole: boolean;
  below: Map<string, PrefixNode>;
}

function prefixTree(prefixes: readonly string[]): PrefixNode {
  const root: PrefixNode = { whole: false, below: new Map() };
  for (const prefix of prefixes) {
    let node = root;
    for (const part of posix.normalize(`/${prefix}`).split('/').filter(Boolean)) {
      let next = node.below.get(part);
      if (!next) node.below.set(part, (next = { whole: false, below: new Map() }));
      node = next;
    }
    node.whole = true;
  }
  return root;
}

/**
 * Below the held folder `folder` (sandbox path `at`), what the prefixes of `node` hold; false once
 * the limit is reached. A name the prefixes go through that is not a folder (a file, a link, a
 * whiteout, or a folder swapped for one under the walk) is reported itself, never entered.
 */
async function walkPrefixes(
  folder: FileHandle,
  at: string,
  node: PrefixNode,
  add: (path: string) => boolean,
): Promise<boolean> {
  if (node.whole) return walk(folder, at, add);
  const names = new Set(await readdir(`/proc/self/fd/${folder.fd}`).catch(() => []));
  for (const [name, below] of node.below) {
    if (!names.has(name)) continue; // the sandbox never wrote there
    const path = `${at}/${name}`;
    const next = await openFolder(folder, name);
    let more: boolean;
    try {
      more = next ? await walkPrefixes(next, path, below, add) : add(path);
    } finally {
      await next?.close();
    }
    if (!more) return false;
  }
  return true;
}

/** Adds every leaf below the held folder `dir`; false once the limit is reached. */
async function walk(folder: FileHandle, dir: string, add: (path: string) => boolean): Promise<boolean> {
  const entries = await readdir(`/proc/self/fd/${folder.fd}`, { withFileTypes: true }).catch(() => []);
  if (entries.length === 0 && dir !== '') return add(dir);
  for (const entry of entries) {
    if (entry.name === BYTECODE_CACHE && entry.isDirectory()) continue;
    const path = `${dir}/${entry.name}`;
    const child = entry.isDirectory() ? await openFolder(folder, entry.name) : undefined;
    let more: boolean;
    try {
      more = child ? await walk(child, path, add) : add(path);
    } finally {
      await child?.close();
    }
    if (!more) return false;
  }
  return true;
}
