import { lstat, readdir } from 'node:fs/promises';
import { posix } from 'node:path';

/**
 * What an overlay upper dir holds under each of `prefixes` (absolute paths inside the sandbox):
 * its files, symlinks, whiteouts (deletions) and empty folders, as sandbox paths, at most `limit`.
 * The upper dir belongs to the sandbox, so nothing in it is followed: each prefix's folders are
 * checked with lstat one by one, and a symlink where a folder should be is reported, not entered.
 * Python's bytecode caches (`__pycache__`) are not counted: any interpreter that runs writes them,
 * and no grader takes them from a diff.
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
  for (const prefix of prefixes) {
    const parts = posix.normalize(`/${prefix}`).split('/').filter(Boolean);
    let at = '';
    let reachable = true;
    for (const part of parts) {
      at = `${at}/${part}`;
      const stat = await lstat(upper + at).catch(() => undefined);
      if (!stat) {
        reachable = false;
        break;
      }
      if (!stat.isDirectory()) {
        add(at); // a file, link or whiteout where the prefix's folder (or the prefix) was
        reachable = false;
        break;
      }
    }
    if (reachable && !(await walk(upper, at, add))) break;
  }
  return [...found].sort();
}

const BYTECODE_CACHE = '__pycache__';

/** Adds every leaf below `dir`; false once the limit is reached. */
async function walk(upper: string, dir: string, add: (path: string) => boolean): Promise<boolean> {
  const entries = await readdir(upper + dir, { withFileTypes: true }).catch(() => []);
  if (entries.length === 0 && dir !== '') return add(dir);
  for (const entry of entries) {
    if (entry.name === BYTECODE_CACHE && entry.isDirectory()) continue;
    const path = `${dir}/${entry.name}`;
    const more = entry.isDirectory() ? await walk(upper, path, add) : add(path);
    if (!more) return false;
  }
  return true;
}
