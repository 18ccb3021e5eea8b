import { createReadStream, type Stats } from 'node:fs';
import { chmod, lchown, link, lstat, lutimes, mkdir, open, readdir, rm, symlink } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { runProgram } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';
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

function refuse(archive: string, path: string, why: string): never {
  throw new SandgymError('invalid_argument', `${archive}: entry "${path}" is refused: ${why}`);
}

/** A relative, normalised path inside the tree; absolute paths and ".." are attacks. */
function inTree(archive: string, raw: string): string {
  if (raw.startsWith('/')) refuse(archive, raw, 'absolute paths may not appear in a layer');
  const parts = raw.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) refuse(archive, raw, '".." would leave the tree');
  return parts.join('/');
}

async function lstatOrUndefined(path: string): Promise<Stats | undefined> {
  return lstat(path).catch(() => undefined);
}

/** Creates the parents of `rel` as real folders; a symlink on the way would lead out of the tree. */
async function ensureParents(archive: string, root: string, rel: string): Promise<void> {
  const parts = rel.split('/').slice(0, -1);
  let path = root;
  for (const part of parts) {
    path = join(path, part);
    const info = await lstatOrUndefined(path);
    if (info?.isSymbolicLink()) refuse(archive, rel, `it goes through the symlink "${part}"`);
    if (!info) await mkdir(path, { mode: 0o755 });
    else if (!info.isDirectory()) refuse(archive, rel, `"${part}" is not a folder`);
  }
}

async function writeData(reader: TarReader, path: string, mode: number): Promise<void> {
  const file = await open(path, 'w', mode);
  try {
    for await (const chunk of reader.readData()) await file.write(chunk);
  } finally {
    await file.close();
  }
}

async function setOwnership(path: string, entry: TarEntry): Promise<void> {
  await lchown(path, entry.uid, entry.gid);
  if (entry.type !== 'symlink') await chmod(path, entry.mode);
  await lutimes(path, entry.mtimeS, entry.mtimeS);
}

/** Extracts one tar stream into `root`, refusing every entry that could escape or plant a device. */
export async function extractTar(
  stream: Readable,
  archive: string,
  root: string,
  whiteouts: WhiteoutMode,
): Promise<void> {
  try {
    await extractEntries(new TarReader(stream, archive), archive, root, whiteouts);
  } finally {
    // a refused entry or an end marker before the end of the file stops the reading early: the
    // file is closed here, not whenever the stream is collected
    stream.destroy();
  }
}

async function extractEntries(
  reader: TarReader,
  archive: string,
  root: string,
  whiteouts: WhiteoutMode,
): Promise<void> {
  const created = new Set<string>();
  const folders: [string, TarEntry][] = [];
  for (let entry = await reader.next(); entry; entry = await reader.next()) {
    const rel = inTree(archive, entry.path);
    if (!rel) continue; // the archive's own root folder
    const name = rel.split('/').pop() ?? '';
    const dir = rel.includes('/') ? rel.slice(0, rel.lastIndexOf('/')) : '';
    if (name.startsWith(WHITEOUT_PREFIX)) {
      await ensureParents(archive, root, rel);
      await applyWhiteout(root, dir, name, whiteouts, created);
      continue;
    }
    await ensureParents(archive, root, rel);
    const path = join(root, rel);
    const existing = await lstatOrUndefined(path);
    if (existing && !(entry.type === 'dir' && existing.isDirectory()))
      await rm(path, { recursive: true, force: true });
    switch (entry.type) {
      case 'dir':
        if (!existing?.isDirectory()) await mkdir(path, { mode: 0o755 });
        folders.push([path, entry]); // modes and times last, once their contents are written
        break;
      case 'file':
        await writeData(reader, path, 0o600);
        await setOwnership(path, entry);
        break;
      case 'symlink':
        await symlink(entry.linkTarget, path);
        await setOwnership(path, entry);
        break;
      case 'hardlink': {
        const target = inTree(archive, entry.linkTarget);
        if (!created.has(target))
          refuse(
            archive,
            entry.path,
            `its hard link target "${entry.linkTarget}" is not an earlier file of this archive`,
          );
        await link(join(root, target), path);
        break;
      }
      default:
        refuse(archive, entry.path, `${entry.type} device nodes and FIFOs may not appear in a layer`);
    }
    created.add(rel);
  }
  for (const [path, entry] of folders.reverse()) await setOwnership(path, entry);
}

async function applyWhiteout(
  root: string,
  dir: string,
  name: string,
  mode: WhiteoutMode,
  created: Set<string>,
): Promise<void> {
  const folder = join(root, dir);
  if (name === OPAQUE_MARKER) {
    if (mode === 'layer') {
      await runProgram('setfattr', ['-n', 'trusted.overlay.opaque', '-v', 'y', folder]);
      return;
    }
    // Opaque: what lower layers put in this folder goes; what this layer put there stays.
    for (const child of await readdir(folder)) {
      const rel = dir ? `${dir}/${child}` : child;
      if (!created.has(rel)) await rm(join(folder, child), { recursive: true, force: true });
    }
    return;
  }
  const hidden = join(folder, name.slice(WHITEOUT_PREFIX.length));
  await rm(hidden, { recursive: true, force: true });
  if (mode === 'layer') await runProgram('mknod', [hidden, 'c', '0', '0']);
}

/**
 * Sets every folder of an unpacked tree to time 0. Files keep the times their archive gave them
 * (a .pyc is checked against its source's), but folders' times record when unpacking touched
 * them (parents made on the way, whiteouts carried out), which would make one image unpacked
 * twice, or from two formats, pack to two digests.
 */
export async function normaliseFolderTimes(root: string): Promise<void> {
  const pending = [root];
  while (pending.length) {
    const dir = pending.pop() ?? root;
    for (const entry of await readdir(dir, { withFileTypes: true }))
      if (entry.isDirectory()) pending.push(join(dir, entry.name));
    await lutimes(dir, 0, 0);
  }
}

/** A tar file's stream, gunzipped when it starts with the gzip magic. */
export async function openTar(path: string): Promise<Readable> {
  const head = Buffer.alloc(2);
  const file = await open(path, 'r').catch((error: unknown) => {
    throw new SandgymError('not_found', `Cannot open archive ${path}`, { cause: error });
  });
  await file.read(head, 0, 2, 0);
  await file.close();
  const stream = createReadStream(path);
  if (head[0] !== 0x1f || head[1] !== 0x8b) return stream;
  const gunzip = stream.pipe(createGunzip());
  // the file goes with the stream its reader holds, however that ends
  gunzip.once('close', () => stream.destroy());
  return gunzip;
}
