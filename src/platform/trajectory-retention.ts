import { readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';

/** How long the trajectory log of an ended sandbox is kept for `sandgym audit` unless told otherwise. */
export const DEFAULT_TRAJECTORY_RETENTION_MS = 7 * 24 * 60 * 60_000;

/**
 * Removes the trajectory logs in `dir` (`<sandbox id>.log`) of sandboxes not in `keep` whose last
 * write is more than `retentionMs` ago; the ids whose logs it removed. A run's end removes its
 * sandboxes' logs at once; this takes the rest, once nobody can step or audit them any more.
 */
export async function removeExpiredTrajectories(
  dir: string,
  keep: ReadonlySet<string>,
  retentionMs: number,
  now = Date.now(),
): Promise<string[]> {
  const removed: string[] = [];
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    const id = name.replace(/\.log$/, '');
    if (id === name || keep.has(id)) continue;
    const written = await stat(join(dir, name)).catch(() => undefined);
    if (!written || now - written.mtimeMs < retentionMs) continue;
    await rm(join(dir, name), { force: true });
    removed.push(id);
  }
  return removed;
}
