import { open, type FileHandle } from 'node:fs/promises';
import { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { unzstd } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';
import { MAX_TREE_DEPTH, type EntryAttributes, type RootedTree } from './rooted-tree.ts';
import { TarReader, type TarEntry } from './tar-reader.ts';

/**
 * How whiteouts (`.wh.NAME`, `.wh..wh..opq`) are treated:
 * - `layer`: kept as overlay whiteouts (a 0/0 character device, an opaque xattr), so the result
 *   hides files of the layers under it when stacked;
 * - `apply`: carried out on the folder, which already holds the lower layers (flattening).
 */
export type WhiteoutMode = 'layer' | 'apply';

const WHITEOUT_PREFIX = '.wh.';
const OPAQUE_MARKER = '.wh..wh..opq';
/** AUFS's own bookkeeping (`.wh..wh.plnk/`, `.wh..wh.aufs`): Docker skips it, and so do we. */
const AUFS_META_PREFIX = '.wh..wh.';

/**
 * What unpacking may cost the node, for one archive or, shared, for all the layers of one image.
 * An archive is the word of whoever made it: its sizes, counts and depths are checked as they
 * come, before the work they ask for, so no archive can exhaust memory, disk, inodes or time.
 */
export interface ArchiveLimits {
  /** Bytes of file data written (a gzip or zstd bomb inflates past this and is refused). */
  maxBytes: number;
  /** Entries of every kind. */
  maxEntries: number;
  /** Whiteouts: in a layer each one is a device node made by a program of its own. */
  maxWhiteouts: number;
  /** Folders deep (the tree enforces its own bound as well, see RootedTree). */
  maxDepth: number;
  /** The time the whole unpacking must end by (ms since the epoch), e.g. a build's deadline. */
  deadlineAt?: number;
}

/** The bounds a node holds every archive to; `maxBytes` is lowered to what its store can take. */
export const DEFAULT_ARCHIVE_LIMITS: ArchiveLimits = {
  maxBytes: 256 * 2 ** 30,
  maxEntries: 2_000_000,
  maxWhiteouts: 100_000,
  maxDepth: MAX_TREE_DEPTH,
};

/** What an archive, or the layers of one image together, have used of their {@link ArchiveLimits}. */
export class ArchiveBudget {
  private bytes = 0;
  private entries = 0;
  private whiteouts = 0;

  constructor(readonly limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS) {}

  private check(archive: string, path: string): void {
    const { deadlineAt } = this.limits;
    if (deadlineAt !== undefined && Date.now() > deadlineAt)
      throw new SandgymError(
        'failed_precondition',
        `${archive}: unpacking stopped at entry "${path}": it ran past its time limit`,
      );
  }

  /** Counts one entry at `depth` folders down. */
  entry(archive: string, path: string, depth: number, whiteout: boolean): void {
    this.check(archive, path);
    const { maxEntries, maxWhiteouts, maxDepth } = this.limits;
    if (++this.entries > maxEntries)
      refuse(archive, path, `the archive holds more than ${maxEntries} entries`);
    if (whiteout && ++this.whiteouts > maxWhiteouts)
      refuse(archive, path, `the archive holds more than ${maxWhiteouts} whiteouts`);
    if (depth > maxDepth) refuse(archive, path, `it is more than ${maxDepth} folders deep`);
  }

  /** A file's data, counted as it is written: past the bound it stops, mid-file. */
  async *data(archive: string, path: string, chunks: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
    for await (const chunk of chunks) {
      this.bytes += chunk.length;
      if (this.bytes > this.limits.maxBytes)
        refuse(
          archive,
          path,
          `the archive unpacks to more than ${Math.floor(this.limits.maxBytes / 2 ** 20)} MiB (the store's room or the project's store quota)`,
        );
      this.check(archive, path);
      yield chunk;
    }
  }
}

/**
 * A budget for unpacking into the store: bytes no more than the store has room for (its free
 * space, the project's quota), and the time limit of what asked for it, if any.
 */
export async function storeBudget(
  store: { unpackRoomBytes(): Promise<number> },
  deadlineAt?: number,
): Promise<ArchiveBudget> {
  const maxBytes = Math.min(DEFAULT_ARCHIVE_LIMITS.maxBytes, await store.unpackRoomBytes());
  return new ArchiveBudget({
    ...DEFAULT_ARCHIVE_LIMITS,
    maxBytes,
    ...(deadlineAt === undefined ? {} : { deadlineAt }),
  });
}

function refuse(archive: string, path: string, why: string): never {
  throw new SandgymError('invalid_argument', `${archive}: entry "${path}" is refused: ${why}`);
}

/**
 * A relative, normalised path inside the tree: an absolute name means the same name beneath the
 * root, as Docker reads it; ".." is an attack.
 */
function inTree(archive: string, raw: string): string {
  const parts = raw.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) refuse(archive, raw, '".." would leave the tree');
  return parts.join('/');
}

function attributesOf(entry: TarEntry): EntryAttributes {
  return { uid: entry.uid, gid: entry.gid, mode: entry.mode, mtimeS: entry.mtimeS };
}

/**
 * Extracts one tar stream into a tree, refusing every entry that could escape or plant a device.
 * Every path is walked beneath the tree's root without following a symlink (see RootedTree), so
 * no entry, link target or whiteout can reach, read or change anything outside it.
 */
export async function extractTar(
  stream: Readable,
  archive: string,
  tree: RootedTree,
  whiteouts: WhiteoutMode,
  budget: ArchiveBudget = new ArchiveBudget(),
): Promise<void> {
  try {
    await extractEntries(new TarReader(stream, archive), archive, tree, whiteouts, budget);
  } finally {
    // a refused entry or an end marker before the end of the file stops the reading early: the
    // file is closed here, not whenever the stream is collected
    stream.destroy();
  }
}

async function extractEntries(
  reader: TarReader,
  archive: string,
  tree: RootedTree,
  whiteouts: WhiteoutMode,
  budget: ArchiveBudget,
): Promise<void> {
  const created = new Set<string>();
  // the regular files this archive wrote, by path, with their inodes: the only hard link targets
  const files = new Map<string, number>();
  const folders: [string, TarEntry][] = [];
  for (let entry = await reader.next(); entry; entry = await reader.next()) {
    const path = inTree(archive, entry.path);
    const names = path ? path.split('/') : [];
    const name = names.pop() ?? '';
    // every entry counts, those skipped too: a million "./" entries are work as well
    budget.entry(archive, entry.path, names.length + 1, name.startsWith(WHITEOUT_PREFIX));
    if (!path) continue; // the archive's own root folder
    if (names.some((parent) => parent.startsWith(AUFS_META_PREFIX))) continue;
    const dir = whiteouts === 'apply' ? await lowerParent(tree, names, created) : names.join('/');
    if (name.startsWith(WHITEOUT_PREFIX)) {
      await applyWhiteout(tree, { archive, entry: entry.path, dir, name }, whiteouts, created);
      continue;
    }
    const rel = dir ? `${dir}/${name}` : name;
    const existing = await tree.lstat(rel);
    if (existing && !(entry.type === 'dir' && existing.isDirectory())) await tree.remove(rel);
    switch (entry.type) {
      case 'dir':
        await tree.makeFolder(rel);
        folders.push([rel, entry]); // modes and times last, once their contents are written
        break;
      case 'file':
        files.set(
          rel,
          (
            await tree.writeFile(
              rel,
              budget.data(archive, entry.path, reader.readData()),
              attributesOf(entry),
            )
          ).ino,
        );
        break;
      case 'symlink':
        await tree.symlink(rel, entry.linkTarget, attributesOf(entry));
        break;
      case 'hardlink': {
        const targetNames = inTree(archive, entry.linkTarget).split('/');
        const targetName = targetNames.pop() ?? '';
        const targetDir =
          whiteouts === 'apply' ? await lowerParent(tree, targetNames, created) : targetNames.join('/');
        const target = targetDir ? `${targetDir}/${targetName}` : targetName;
        const inode = files.get(target);
        if (inode === undefined)
          refuse(
            archive,
            entry.path,
            `its hard link target "${entry.linkTarget}" is not an earlier file of this archive`,
          );
        await tree.link(target, rel, inode);
        files.set(rel, inode);
        break;
      }
      default:
        refuse(archive, entry.path, `${entry.type} device nodes and FIFOs may not appear in a layer`);
    }
    if (entry.type !== 'file' && entry.type !== 'hardlink') files.delete(rel);
    created.add(rel);
  }
  // a folder a later entry replaced or whited out is gone: nothing to set
  for (const [rel, entry] of folders.reverse()) await tree.setAttributes(rel, attributesOf(entry));
}

/**
 * The folder an entry goes in when an image is flattened: a symlink a lower layer left on its
 * path (`lib -> usr/lib` on merged /usr) is followed inside the root, as Docker's chrooted
 * unpacking does, so the upper layer's `lib/x` lands in `usr/lib` and `lib` stays a link. A symlink
 * this archive made is not followed: a write through it is refused, as a layer's own trick.
 */
async function lowerParent(
  tree: RootedTree,
  names: readonly string[],
  created: Set<string>,
): Promise<string> {
  const dir = names.join('/');
  if (!dir) return dir;
  // the common case costs one walk: the folder is there (or missing) with no symlink on the way
  const direct = await tree.lstat(dir).catch(() => null);
  if (direct === undefined || direct?.isDirectory()) return dir;
  let resolved: string[] = [];
  for (const [i, name] of names.entries()) {
    const candidate = [...resolved, name].join('/');
    const stats = await tree.lstat(candidate).catch(() => undefined);
    if (stats?.isSymbolicLink() && !created.has(candidate)) {
      const real = await tree.realPath(candidate);
      // a dangling link: left on the path, where the write is refused naming it
      if (real === undefined) return [...resolved, ...names.slice(i)].join('/');
      resolved = real ? real.split('/') : [];
      continue;
    }
    resolved.push(name);
  }
  return resolved.join('/');
}

/** A whiteout entry: the folder it is in, and its name. */
interface Whiteout {
  archive: string;
  entry: string;
  dir: string;
  name: string;
}

async function applyWhiteout(
  tree: RootedTree,
  { archive, entry, dir, name }: Whiteout,
  mode: WhiteoutMode,
  created: Set<string>,
): Promise<void> {
  if (name === OPAQUE_MARKER) {
    if (mode === 'layer') {
      await tree.markOpaque(dir);
      return;
    }
    // Opaque: what lower layers put in this folder goes; what this layer put there stays.
    for (const child of await tree.children(dir)) {
      const rel = dir ? `${dir}/${child}` : child;
      if (!created.has(rel)) await tree.remove(rel);
    }
    return;
  }
  if (name.startsWith(AUFS_META_PREFIX)) return;
  const hidden = name.slice(WHITEOUT_PREFIX.length);
  if (hidden === '' || hidden === '.' || hidden === '..')
    refuse(archive, entry, `a whiteout must name a file or folder, not "${hidden}"`);
  const rel = dir ? `${dir}/${hidden}` : hidden;
  await tree.remove(rel);
  if (mode === 'layer') await tree.makeWhiteout(rel);
}

/**
 * Sets every folder of an unpacked tree to time 0. Files keep the times their archive gave them
 * (a .pyc is checked against its source's), but folders' times record when unpacking touched
 * them (parents made on the way, whiteouts carried out), which would make one image unpacked
 * twice, or from two formats, pack to two digests.
 */
export async function normaliseFolderTimes(tree: RootedTree): Promise<void> {
  await tree.setFolderTimes(0);
}

/** zstd's frame magic (28 b5 2f fd), as image layers of `application/vnd.oci.image.layer.v1.tar+zstd` start. */
const ZSTD_MAGIC = Buffer.from([0x28, 0xb5, 0x2f, 0xfd]);

/**
 * A tar's stream from an open file, gunzipped or un-zstd'ed by its first bytes (not its name or
 * media type, which its maker chose); it closes the file.
 */
export async function tarStream(file: FileHandle): Promise<Readable> {
  const head = Buffer.alloc(4);
  await file.read(head, 0, 4, 0).catch(async (error: unknown) => {
    await file.close();
    throw error;
  });
  const stream = file.createReadStream({ start: 0 });
  if (head.equals(ZSTD_MAGIC)) return Readable.from(unzstd(stream));
  if (head[0] !== 0x1f || head[1] !== 0x8b) return stream;
  const gunzip = stream.pipe(createGunzip());
  // the file goes with the stream its reader holds, however that ends
  gunzip.once('close', () => stream.destroy());
  return gunzip;
}

/** A tar file's stream by its path (the user's own archive). */
export async function openTar(path: string): Promise<Readable> {
  const file = await open(path, 'r').catch((error: unknown) => {
    throw new SandgymError('not_found', `Cannot open archive ${path}`, { cause: error });
  });
  return tarStream(file);
}
