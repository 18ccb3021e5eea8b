import { existsSync } from 'node:fs';
import { chmod, readFile, rm, stat } from 'node:fs/promises';
import { SandgymError } from '../../common/index.ts';
import { runProgram } from './run-program.ts';

/** An active swap area, as /proc/swaps lists it, with the inode of a swap file. */
export interface SwapArea {
  filename: string;
  sizeKib: number;
  inode: number | undefined;
}

/** The swap areas the kernel uses now. */
export async function activeSwapAreas(): Promise<SwapArea[]> {
  const lines = (await readFile('/proc/swaps', 'utf8')).split('\n').slice(1).filter(Boolean);
  return Promise.all(
    lines.map(async (line) => {
      const [filename = '', , size = '0'] = line.split(/\s+/);
      const inode = await stat(filename).then(
        (s) => s.ino,
        () => undefined,
      );
      return { filename, sizeKib: Number(size), inode };
    }),
  );
}

/** True when `area` is still active: same file, same inode, same size. */
export function stillActive(area: SwapArea, now: readonly SwapArea[]): boolean {
  return now.some(
    (a) => a.filename === area.filename && a.inode === area.inode && a.sizeKib === area.sizeKib,
  );
}

/**
 * Makes `path` an active swap file of `sizeMib` (for hibernating sandboxes): created (no holes),
 * formatted and enabled when it is not already active. Returns whether anything was done.
 */
export async function ensureSwapFile(path: string, sizeMib: number): Promise<boolean> {
  if (!Number.isInteger(sizeMib) || sizeMib < 40) {
    throw new SandgymError('invalid_argument', `A swap file needs at least 40 MiB, got ${sizeMib}`);
  }
  if ((await activeSwapAreas()).some((a) => a.filename === path)) return false;
  if (existsSync(path)) await rm(path);
  // dd, not fallocate: the kernel refuses swap files with unwritten extents on some filesystems
  await runProgram('dd', ['if=/dev/zero', `of=${path}`, 'bs=1M', `count=${sizeMib}`, 'status=none']);
  await chmod(path, 0o600);
  await runProgram('mkswap', [path]);
  await runProgram('swapon', [path]);
  return true;
}

/** Disables and deletes a swap file (its pages come back into memory first). */
export async function removeSwapFile(path: string): Promise<void> {
  if ((await activeSwapAreas()).some((a) => a.filename === path)) await runProgram('swapoff', [path]);
  await rm(path, { force: true });
}
