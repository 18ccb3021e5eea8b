import { renameSync, rmSync, writeFileSync } from 'node:fs';
import { open, rename, rm } from 'node:fs/promises';
import { dirname, basename, join } from 'node:path';
import { randomBytes } from 'node:crypto';

/** Options for {@link writeFileAtomic}. */
export interface AtomicWriteOptions {
  /**
   * fsync the file and its folder, so that the new content survives a power loss (default). Off,
   * a crash of the writing process still leaves old or new content, never a torn file.
   */
  sync?: boolean;
  /** Permission bits of the new file (default 0o644; 0o600 for secrets). */
  mode?: number;
}

/** A fresh hidden temp file name in the same folder as `path`, so a rename moves it into place. */
function tempPathBeside(path: string): string {
  return join(dirname(path), `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);
}

/**
 * Writes a file so that a crash leaves either the old content or the new, never a torn file:
 * write to a temp file beside it, fsync, rename over the target, fsync the directory.
 */
export async function writeFileAtomic(
  path: string,
  data: string | Uint8Array,
  { sync = true, mode = 0o644 }: AtomicWriteOptions = {},
): Promise<void> {
  const temp = tempPathBeside(path);
  const file = await open(temp, 'w', mode);
  try {
    await file.writeFile(data);
    if (sync) await file.sync();
  } catch (error) {
    await file.close();
    await rm(temp, { force: true });
    throw error;
  }
  await file.close();
  await rename(temp, path);
  if (!sync) return;
  const dir = await open(dirname(path), 'r');
  try {
    await dir.sync();
  } finally {
    await dir.close();
  }
}

/**
 * {@link writeFileAtomic} without fsync, done at once on the calling thread: for a record of a
 * few KiB on a hot path (a sandbox's state, written with every create), where the thread pool's
 * round trip for each of open, write, close and rename costs more than the writes themselves.
 */
export function writeSmallFileAtomicNow(path: string, data: string, mode = 0o644): void {
  const temp = tempPathBeside(path);
  try {
    writeFileSync(temp, data, { mode });
    renameSync(temp, path);
  } catch (error) {
    rmSync(temp, { force: true });
    throw error;
  }
}
