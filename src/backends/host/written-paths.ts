import { constants } from 'node:fs';
import { lstat, open, readdir, type FileHandle } from 'node:fs/promises';
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
    for (const prefix of prefixes) {
      const parts = posix.normalize(`/${prefix}`).split('/').filter(Boolean);
      const more = await walkPrefix(root, parts, add);
      if (!more) break;
    }
  } finally {
    await root.close();
  }
  return [...found].sort();
}

/** Walks down to a prefix's folder, then everything below it; false once the limit is reached. */
async function walkPrefix(
  root: FileHandle,
  parts: string[],
  add: (path: string) => boolean,
): Promise<boolean> {
  const held: FileHandle[] = [];
  try {
    let folder = root;
    let at = '';
    for (const part of parts) {
      // lstat of the last name only: the held folder is reached through its fd, nothing followed
      const there = await lstat(`/proc/self/fd/${folder.fd}/${part}`).catch(() => undefined);
      if (!there) return true; // the sandbox never wrote there
      at = `${at}/${part}`;
      const next = await openFolder(folder, part);
      // a file, link or whiteout where the prefix's folder (or the prefix) was
      if (!next) return add(at);
      held.push(next);
      folder = next;
    }
    return await walk(folder, at, add);
  } finally {
    for (const handle of held) await handle.close();
  }
}

const BYTECODE_CACHE = '__pycache__';

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
