import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rename, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';

/**
 * Builds the folder `target` in a temp folder beside it, then renames it into place: a crash
 * leaves nothing half-made, and when two processes build at once, the one that loses the rename
 * keeps the winner's folder (recognised by its `doneFile`) and drops its own.
 */
export async function buildFolderOnce(
  target: string,
  doneFile: string,
  build: (work: string) => Promise<void>,
): Promise<void> {
  await mkdir(dirname(target), { recursive: true });
  const work = await mkdtemp(`${target}.building-`);
  try {
    await build(work);
    await rename(work, target).catch(async (error: unknown) => {
      if (!existsSync(join(target, doneFile))) throw error;
      await rm(work, { recursive: true, force: true });
    });
  } catch (error) {
    await rm(work, { recursive: true, force: true });
    throw error;
  }
}
