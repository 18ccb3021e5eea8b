import type { Stats } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { SandgymError } from '../../common/index.ts';
import type { RootedTree } from './rooted-tree.ts';
import { extractTar, tarStream, type ArchiveBudget } from './tar-extract.ts';

/** One COPY/ADD source: its path in the source tree (no symlink left on it), and its name in a folder. */
export interface TreeSource {
  path: string;
  name: string;
}

/** How {@link copyIntoTree} copies. */
export interface CopyOptions {
  kind: 'COPY' | 'ADD';
  /** Whether a file source goes into `target` as a folder (else it becomes `target`). */
  intoFolder: boolean;
  /** What errors name: the Dockerfile and line. */
  where: string;
  /** Which paths of the source tree to take (the build context's `.dockerignore`). */
  keep?: (path: string) => boolean;
  /** What an archive ADD unpacks may cost (all archives of the step together). */
  budget?: ArchiveBudget;
}

/** Whether a file is an archive ADD unpacks: a tar, or a gzip-compressed one (by its bytes, not its name). */
async function isArchive(file: FileHandle): Promise<boolean> {
  const head = Buffer.alloc(512);
  const { bytesRead } = await file.read(head, 0, 512, 0);
  if (bytesRead >= 2 && head[0] === 0x1f && head[1] === 0x8b) return true;
  return bytesRead >= 262 && head.subarray(257, 262).toString() === 'ustar';
}

/** A file's bytes in chunks, through one buffer (each chunk is written before the next is read). */
async function* chunksOf(file: FileHandle, size: number): AsyncGenerator<Uint8Array> {
  const buffer = Buffer.allocUnsafe(Math.min(Math.max(size, 1), 1 << 20));
  for (;;) {
    const { bytesRead } = await file.read(buffer, 0, buffer.length, null);
    if (bytesRead === 0) return;
    yield buffer.subarray(0, bytesRead);
  }
}

/**
 * Copies sources from one tree into `target` of another: a folder's contents (not the folder
 * itself), a file as a file, an archive unpacked by ADD. Symlinks stay links, and both sides are
 * walked without following one, so neither a source tree nor what an earlier source wrote can
 * lead a read or a write off its tree. Returns every path it wrote, for ownership.
 */
export async function copyIntoTree(
  from: RootedTree,
  sources: readonly TreeSource[],
  to: RootedTree,
  target: string,
  options: CopyOptions,
): Promise<string[]> {
  const written: string[] = [];
  for (const source of sources) {
    const stats = await from.lstat(source.path);
    if (!stats)
      throw new SandgymError(
        'invalid_argument',
        `${options.where}: ${options.kind} source ${source.path} does not exist`,
      );
    if (
      options.kind === 'ADD' &&
      stats.isFile() &&
      (await unpacked(from, source.path, to, target, options))
    ) {
      written.push(target, ...(await to.entries(target)).map((entry) => entry.path));
    } else if (stats.isDirectory()) {
      await copyFolder(from, source.path, to, target, options);
      written.push(target, ...(await to.entries(target)).map((entry) => entry.path));
    } else {
      const path = options.intoFolder ? join(target, source.name) : target;
      await copyEntry(from, { path: source.path, stats }, to, path, options);
      written.push(path);
    }
  }
  return written;
}

function join(folder: string, name: string): string {
  return folder ? `${folder}/${name}` : name;
}

/** ADD of an archive: unpacked into `target` (whiteouts carried out); false if it is no archive. */
async function unpacked(
  from: RootedTree,
  path: string,
  to: RootedTree,
  target: string,
  options: CopyOptions,
): Promise<boolean> {
  const file = await from.openFile(path);
  let handedOver = false;
  try {
    if (!(await isArchive(file))) return false;
    const label = `${options.where}: ADD ${path}`;
    const into = await to.subtree(target, label);
    try {
      handedOver = true; // the tar stream closes the file, however it ends
      await extractTar(await tarStream(file), label, into, 'apply', options.budget);
    } finally {
      await into.close();
    }
    return true;
  } finally {
    if (!handedOver) await file.close();
  }
}

/** A folder's contents into `target`, each entry's mode and times kept (folders' times last). */
async function copyFolder(
  from: RootedTree,
  path: string,
  to: RootedTree,
  target: string,
  options: CopyOptions,
): Promise<void> {
  const existing = await to.lstat(target);
  if (existing && !existing.isDirectory()) await to.remove(target);
  await to.makeFolder(target);
  const folders: [string, Stats][] = [];
  const prefix = path ? path.length + 1 : 0;
  for (const entry of await from.entries(path, options.keep)) {
    const destination = join(target, entry.path.slice(prefix));
    await copyEntry(from, entry, to, destination, options);
    if (entry.stats.isDirectory()) folders.push([destination, entry.stats]);
  }
  for (const [folder, stats] of folders.reverse()) await to.setAttributes(folder, attributesOf(stats));
}

function attributesOf(stats: Stats): { mode: number; atimeS: number; mtimeS: number } {
  return { mode: stats.mode, atimeS: stats.atimeMs / 1000, mtimeS: stats.mtimeMs / 1000 };
}

/** One entry, replacing what is in its place unless both are folders. */
async function copyEntry(
  from: RootedTree,
  entry: { path: string; stats: Stats },
  to: RootedTree,
  destination: string,
  options: CopyOptions,
): Promise<void> {
  const { path, stats } = entry;
  const existing = await to.lstat(destination);
  if (existing && !(existing.isDirectory() && stats.isDirectory())) await to.remove(destination);
  if (stats.isDirectory()) await to.makeFolder(destination);
  else if (stats.isSymbolicLink()) await to.symlink(destination, await from.readlink(path), {});
  else if (stats.isFile()) {
    const file = await from.openFile(path);
    try {
      await to.writeFile(destination, chunksOf(file, stats.size), attributesOf(stats));
    } finally {
      await file.close();
    }
  } else
    throw new SandgymError(
      'invalid_argument',
      `${options.where}: ${options.kind} source ${path} is a device, FIFO or socket, which a layer may not hold`,
    );
}
