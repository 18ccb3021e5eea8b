import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';

/** Bytes the files of a folder and its subfolders take on disk (allocated blocks: sparse files count what they hold). */
export async function folderBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    total += entry.isDirectory() ? await folderBytes(path) : (await stat(path)).blocks * 512;
  }
  return total;
}
