import { constants, type Stats } from 'node:fs';
import {
  lchown,
  link,
  lstat,
  lutimes,
  mkdir,
  open,
  readdir,
  readlink,
  rmdir,
  symlink,
  unlink,
  type FileHandle,
} from 'node:fs/promises';
import { runProgram } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW, O_DIRECTORY, O_NONBLOCK } = constants;
/** A folder opened so that a symlink (or anything but a folder) in its place fails the open. */
const FOLDER_FLAGS = O_RDONLY | O_DIRECTORY | O_NOFOLLOW;
/** A file opened without following a symlink, and without blocking on a FIFO or a device. */
const FILE_FLAGS = O_RDONLY | O_NOFOLLOW | O_NONBLOCK;
/** Linux's NAME_MAX, and PATH_MAX less its NUL: longer is no name a layer image can hold. */
const NAME_MAX_BYTES = 255;
const PATH_MAX_BYTES = 4095;
/**
 * How many folders deep a path may go. Each level of a walk holds a folder open, so a chain of
 * thousands (which PATH_MAX alone allows with one-letter names) would exhaust descriptors; real
 * trees (node_modules, Java packages) stay far below this.
 */
export const MAX_TREE_DEPTH = 256;
/** As the kernel's MAXSYMLINKS: a chain of links longer than this is a loop. */
const MAX_LINK_HOPS = 40;

/** Owner, mode and times to give an entry; what is left out stays as the kernel made it. */
export interface EntryAttributes {
  uid?: number;
  gid?: number;
  mode?: number;
  /** Seconds; the access time is the modification time unless given. */
  mtimeS?: number;
  atimeS?: number;
}

/** One entry below a folder of a {@link RootedTree}: its path from the tree's root, and its lstat. */
export interface TreeEntry {
  path: string;
  stats: Stats;
}

function errnoOf(error: unknown): string | undefined {
  return (error as NodeJS.ErrnoException | undefined)?.code;
}

/** Where a name in a held folder is, for the kernel: through the fd, never through a path string. */
function at(folder: FileHandle, name?: string): string {
  // a closed FileHandle's fd is -1: the path then names nothing, never a reused descriptor
  return name === undefined ? `/proc/self/fd/${folder.fd}` : `/proc/self/fd/${folder.fd}/${name}`;
}

/** The same place for another process (mknod, setfattr), which has our descriptors under our pid. */
function forProgram(folder: FileHandle, name?: string): string {
  return `/proc/${process.pid}/fd/${folder.fd}${name === undefined ? '' : `/${name}`}`;
}

async function lstatOrUndefined(path: string): Promise<Stats | undefined> {
  return lstat(path).catch((error: unknown) => {
    if (errnoOf(error) === 'ENOENT' || errnoOf(error) === 'ENOTDIR') return undefined;
    throw error;
  });
}

/**
 * A folder tree that cannot be left: the root is held open, and every path is walked from it one
 * checked name at a time, each folder opened `O_NOFOLLOW | O_DIRECTORY` through
 * `/proc/self/fd/<parent>/<name>`, and every final operation (create, link, remove, chown, read)
 * done on `/proc/self/fd/<folder>/<name>`. A symlink, `..` or a swap under a walk can therefore
 * never lead it out (Node has no `openat2(RESOLVE_BENEATH)`; this is its fd-relative equivalent).
 *
 * Writes never follow a symlink: one on the way is refused, one in the final place is replaced
 * only by an explicit {@link remove}. Reads of a tree someone else made (an image's manifests, a
 * stage's files) first resolve their path with {@link realPath}, which follows symlinks as a
 * `chroot` would: absolute targets start again at the root and `..` stops there.
 *
 * One operation runs at a time (they queue), so the folders it keeps open along the last path
 * walked are never closed under another.
 */
export class RootedTree implements AsyncDisposable {
  /** The folders of the last path walked, root first: the next walk reuses their common start. */
  private chain: { name: string; folder: FileHandle }[] = [];
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;

  private constructor(
    private readonly root: FileHandle,
    /** What errors name: the archive, or the build step, the tree's content came from. */
    readonly label: string,
  ) {}

  /** The tree at `path` (a folder of ours: symlinks on the way to it are followed). */
  static async open(path: string, label: string): Promise<RootedTree> {
    return new RootedTree(await open(path, O_RDONLY | O_DIRECTORY), label);
  }

  /** A folder below this tree, made with its parents when missing, as a tree of its own. */
  subtree(path: string, label: string): Promise<RootedTree> {
    return this.exclusive(async () => {
      const folder = await this.folder(this.names(path), path, true);
      return new RootedTree(await open(at(folder!), O_RDONLY | O_DIRECTORY), label);
    });
  }

  /** Runs one operation after those already queued: walks share the open chain of folders. */
  private exclusive<T>(operation: () => Promise<T>): Promise<T> {
    const result = this.queue.then(() => {
      if (this.closed) throw new SandgymError('failed_precondition', `${this.label}: the tree is closed`);
      return operation();
    });
    this.queue = result.catch(() => undefined);
    return result;
  }

  private refuse(path: string, why: string): never {
    throw new SandgymError('invalid_argument', `${this.label}: "${path}" is refused: ${why}`);
  }

  /** A relative path's names, each one a name a folder can hold; `..` is an attack here. */
  private names(path: string): string[] {
    if (Buffer.byteLength(path) > PATH_MAX_BYTES)
      this.refuse(path, `the path is longer than ${PATH_MAX_BYTES} bytes`);
    const names = path.split('/').filter((name) => name !== '' && name !== '.');
    if (names.length > MAX_TREE_DEPTH) this.refuse(path, `it is more than ${MAX_TREE_DEPTH} folders deep`);
    for (const name of names) this.checkName(path, name);
    return names;
  }

  private checkName(path: string, name: string): void {
    if (name === '..') this.refuse(path, '".." would leave the tree');
    if (name.includes('\0')) this.refuse(path, 'it holds a NUL byte');
    if (Buffer.byteLength(name) > NAME_MAX_BYTES)
      this.refuse(path, `the name "${name.slice(0, 40)}…" is longer than ${NAME_MAX_BYTES} bytes`);
  }

  /** The folder `names` leads to, walked without following anything; undefined if it is missing. */
  private async folder(
    names: readonly string[],
    path: string,
    create: boolean,
  ): Promise<FileHandle | undefined> {
    let depth = 0;
    while (depth < this.chain.length && depth < names.length && this.chain[depth]?.name === names[depth])
      depth++;
    await this.forget(depth);
    let current = depth === 0 ? this.root : this.chain[depth - 1]!.folder;
    for (const name of names.slice(depth)) {
      const next = await this.openFolder(current, name, path, create);
      if (!next) return undefined;
      this.chain.push({ name, folder: next });
      current = next;
    }
    return current;
  }

  /** Closes the chain's folders from `depth` on: a removal may have taken them out of the tree. */
  private async forget(depth: number): Promise<void> {
    for (const { folder } of this.chain.splice(depth).reverse()) await folder.close();
  }

  private async openFolder(
    parent: FileHandle,
    name: string,
    path: string,
    create: boolean,
  ): Promise<FileHandle | undefined> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await open(at(parent, name), FOLDER_FLAGS);
      } catch (error) {
        const code = errnoOf(error);
        if (code === 'ENOENT' && create && attempt === 0) {
          await mkdir(at(parent, name), 0o755).catch((made: unknown) => {
            if (errnoOf(made) !== 'EEXIST') throw made;
          });
          continue;
        }
        if (code === 'ENOENT') return undefined;
        if (code !== 'ENOTDIR' && code !== 'ELOOP') throw error;
        const stats = await lstatOrUndefined(at(parent, name));
        this.refuse(
          path,
          stats?.isSymbolicLink() ? `it goes through the symlink "${name}"` : `"${name}" is not a folder`,
        );
      }
    }
  }

  /** The folder holding a path's last name, and that name. */
  private async place(
    path: string,
    create: boolean,
  ): Promise<{ folder: FileHandle; name: string } | undefined> {
    const names = this.names(path);
    const name = names.pop();
    if (name === undefined) this.refuse(path, "it names the tree's root");
    const folder = await this.folder(names, path, create);
    return folder && { folder, name };
  }

  /** What is at a path, not following a final symlink; undefined when nothing is. */
  lstat(path: string): Promise<Stats | undefined> {
    return this.exclusive(async () => {
      const names = this.names(path);
      if (names.length === 0) return this.root.stat();
      const place = await this.place(path, false);
      return place && lstatOrUndefined(at(place.folder, place.name));
    });
  }

  /** Removes what is at a path, a folder with everything below it; nothing there is fine. */
  remove(path: string): Promise<void> {
    return this.exclusive(async () => {
      // the walk leaves the chain ending at the parent: no folder it holds is below what goes
      const place = await this.place(path, false);
      if (place) await removeAt(place.folder, place.name);
    });
  }

  /** Makes a folder and its parents (mode 0755) where missing; anything else in the way is refused. */
  makeFolder(path: string): Promise<void> {
    return this.exclusive(async () => {
      await this.folder(this.names(path), path, true);
    });
  }

  /** Writes a new file (refused if the name is taken) from chunks, then gives it its attributes. */
  writeFile(
    path: string,
    data: Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    attributes: EntryAttributes,
  ): Promise<Stats> {
    return this.exclusive(async () => {
      const { folder, name } = (await this.place(path, true))!;
      const file = await open(at(folder, name), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
      try {
        for await (const chunk of data) await file.write(chunk);
        await applyAttributes(file, attributes);
        return await file.stat();
      } finally {
        await file.close();
      }
    });
  }

  /** Makes a symlink (refused if the name is taken); its target is kept as written, never followed. */
  symlink(path: string, target: string, attributes: EntryAttributes): Promise<void> {
    return this.exclusive(async () => {
      if (target === '' || target.includes('\0') || Buffer.byteLength(target) > PATH_MAX_BYTES)
        this.refuse(path, 'its link target is empty, holds a NUL byte or is too long');
      const { folder, name } = (await this.place(path, true))!;
      await symlink(target, at(folder, name));
      await applyLinkAttributes(at(folder, name), attributes);
    });
  }

  /**
   * Hard-links `path` to `existing`, which must still be the regular file `inode` (one this tree's
   * writer made), reached without symlinks: never anything outside the tree.
   */
  link(existing: string, path: string, inode: number): Promise<void> {
    return this.exclusive(async () => {
      const names = this.names(existing);
      const sourceName = names.pop();
      // the source's folder is held apart from the chain, which the destination's walk may change;
      // a source through a symlink or a non-folder is no file this tree wrote
      const source =
        sourceName === undefined
          ? undefined
          : await this.detachedFolder(names, existing).catch((error: unknown) => {
              if (error instanceof SandgymError) return undefined;
              throw error;
            });
      try {
        const stats = source && (await lstatOrUndefined(at(source, sourceName)));
        if (!stats?.isFile() || stats.ino !== inode)
          this.refuse(path, `its hard link target "${existing}" is not a file written earlier`);
        const { folder, name } = (await this.place(path, true))!;
        await link(at(source!, sourceName), at(folder, name));
      } finally {
        await source?.close();
      }
    });
  }

  /** A folder walked like {@link folder}, but opened apart from the chain: the caller closes it. */
  private async detachedFolder(names: readonly string[], path: string): Promise<FileHandle | undefined> {
    const folder = await this.folder(names, path, false);
    return folder && open(at(folder), O_RDONLY | O_DIRECTORY);
  }

  /** Gives what is at a path its attributes (a symlink its owner and times); false if it is gone. */
  setAttributes(path: string, attributes: EntryAttributes): Promise<boolean> {
    return this.exclusive(async () => {
      if (this.names(path).length === 0) {
        await applyAttributes(this.root, attributes);
        return true;
      }
      const place = await this.place(path, false);
      const stats = place && (await lstatOrUndefined(at(place.folder, place.name)));
      if (!place || !stats) return false;
      if (!stats.isFile() && !stats.isDirectory()) {
        await applyLinkAttributes(at(place.folder, place.name), attributes);
        return true;
      }
      const handle = await open(at(place.folder, place.name), FILE_FLAGS);
      try {
        await applyAttributes(handle, attributes);
      } finally {
        await handle.close();
      }
      return true;
    });
  }

  /** The names in a folder; none when it is missing. */
  children(path: string): Promise<string[]> {
    return this.exclusive(async () => {
      const folder = await this.folder(this.names(path), path, false);
      return folder ? readdir(at(folder)) : [];
    });
  }

  /**
   * Everything below a folder, parents before their children, without following symlinks;
   * `keep` prunes (a folder it refuses is not entered).
   */
  entries(path: string, keep: (path: string) => boolean = () => true): Promise<TreeEntry[]> {
    return this.exclusive(async () => {
      const names = this.names(path);
      const start = await this.detachedFolder(names, path);
      const found: TreeEntry[] = [];
      const visit = async (folder: FileHandle, prefix: string, depth: number): Promise<void> => {
        // a tree someone else made (a stage's RUN steps) may nest folders without end
        if (depth > MAX_TREE_DEPTH) this.refuse(prefix, `it is more than ${MAX_TREE_DEPTH} folders deep`);
        for (const name of (await readdir(at(folder))).sort()) {
          const child = prefix ? `${prefix}/${name}` : name;
          const stats = keep(child) ? await lstatOrUndefined(at(folder, name)) : undefined;
          if (!stats) continue;
          found.push({ path: child, stats });
          if (!stats.isDirectory()) continue;
          const inner = await open(at(folder, name), FOLDER_FLAGS);
          try {
            await visit(inner, child, depth + 1);
          } finally {
            await inner.close();
          }
        }
      };
      if (!start) return found;
      try {
        await visit(start, names.join('/'), names.length + 1);
      } finally {
        await start.close();
      }
      return found;
    });
  }

  /** Sets the times of every folder of the tree, its root included, each through its own fd. */
  setFolderTimes(timeS: number): Promise<void> {
    return this.exclusive(async () => {
      const visit = async (folder: FileHandle): Promise<void> => {
        for (const entry of await readdir(at(folder), { withFileTypes: true })) {
          if (!entry.isDirectory()) continue;
          const inner = await open(at(folder, entry.name), FOLDER_FLAGS);
          try {
            await visit(inner);
          } finally {
            await inner.close();
          }
        }
        await folder.utimes(timeS, timeS);
      };
      await visit(this.root);
    });
  }

  /** Opens a regular file for reading; a symlink, a missing file or anything else is refused. */
  openFile(path: string): Promise<FileHandle> {
    return this.exclusive(async () => {
      const place = await this.place(path, false);
      if (!place) this.refuse(path, 'it does not exist');
      const file = await open(at(place.folder, place.name), FILE_FLAGS).catch((error: unknown) => {
        if (errnoOf(error) === 'ENOENT') this.refuse(path, 'it does not exist');
        if (errnoOf(error) === 'ELOOP') this.refuse(path, 'it is a symlink');
        throw error;
      });
      if ((await file.stat()).isFile()) return file;
      await file.close();
      this.refuse(path, 'it is not a regular file');
    });
  }

  /** A symlink's target, as written. */
  readlink(path: string): Promise<string> {
    return this.exclusive(async () => {
      const place = await this.place(path, false);
      if (!place) this.refuse(path, 'it does not exist');
      return readlink(at(place.folder, place.name));
    });
  }

  /**
   * A path with every symlink on it resolved as if the tree's root were `/` (absolute targets
   * start again at the root, `..` stops there), the way Docker resolves a `COPY --from` source.
   * Undefined when the path leads to nothing. The result has no symlink left in it, so the other
   * operations (which refuse symlinks) accept it, unless the tree changes in between.
   */
  realPath(path: string): Promise<string | undefined> {
    return this.exclusive(async () => {
      const resolved: string[] = [];
      const pending = path.split('/').reverse();
      let hops = 0;
      while (pending.length > 0) {
        const name = pending.pop()!;
        if (name === '' || name === '.') continue;
        if (name === '..') {
          resolved.pop();
          continue;
        }
        this.checkName(path, name);
        const folder = await this.folder(resolved, path, false);
        const stats = folder && (await lstatOrUndefined(at(folder, name)));
        if (!folder || !stats) return undefined;
        if (stats.isSymbolicLink()) {
          if (++hops > MAX_LINK_HOPS)
            this.refuse(path, `it runs through more than ${MAX_LINK_HOPS} symlinks`);
          const target = await readlink(at(folder, name));
          if (target.startsWith('/')) resolved.length = 0;
          pending.push(...target.split('/').reverse());
          continue;
        }
        // a file with more path after it ("file/x", "file/..") names nothing, as in the kernel
        if (!stats.isDirectory() && pending.some((rest) => rest !== '')) return undefined;
        resolved.push(name);
      }
      return resolved.join('/');
    });
  }

  /** Opens a regular file for reading, its path resolved as {@link realPath} does. */
  async openResolved(path: string): Promise<FileHandle> {
    const real = await this.realPath(path);
    if (real === undefined) this.refuse(path, 'it does not exist');
    return this.openFile(real);
  }

  /** A file's bytes, its path resolved as {@link realPath} does; refused past `maxBytes`. */
  async readFile(path: string, maxBytes: number): Promise<Buffer> {
    const file = await this.openResolved(path);
    try {
      if ((await file.stat()).size > maxBytes)
        this.refuse(path, `it is larger than ${Math.round(maxBytes / 2 ** 20)} MiB`);
      return await file.readFile();
    } finally {
      await file.close();
    }
  }

  /** Puts an overlay whiteout (a 0/0 character device) at a path, its folders made if missing. */
  makeWhiteout(path: string): Promise<void> {
    return this.exclusive(async () => {
      const { folder, name } = (await this.place(path, true))!;
      await runProgram('mknod', [forProgram(folder, name), 'c', '0', '0']);
    });
  }

  /** Marks a folder opaque for overlayfs (it hides the same folder of the layers under it). */
  markOpaque(path: string): Promise<void> {
    return this.exclusive(async () => {
      const folder = await this.folder(this.names(path), path, true);
      await runProgram('setfattr', ['-n', 'trusted.overlay.opaque', '-v', 'y', forProgram(folder!)]);
    });
  }

  /** Closes the tree's folders; idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    await this.queue;
    this.closed = true;
    await this.forget(0);
    await this.root.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** Runs `use` on the tree at a folder of ours, closing the tree however `use` ends. */
export async function withRootedTree<T>(
  path: string,
  label: string,
  use: (tree: RootedTree) => Promise<T>,
): Promise<T> {
  const tree = await RootedTree.open(path, label);
  try {
    return await use(tree);
  } finally {
    await tree.close();
  }
}

/** Removes a name of a held folder, a folder's contents first, each one through its own fd. */
async function removeAt(parent: FileHandle, name: string): Promise<void> {
  const stats = await lstatOrUndefined(at(parent, name));
  if (!stats) return;
  if (!stats.isDirectory()) {
    await unlink(at(parent, name));
    return;
  }
  const folder = await open(at(parent, name), FOLDER_FLAGS);
  try {
    for (const child of await readdir(at(folder))) await removeAt(folder, child);
  } finally {
    await folder.close();
  }
  await rmdir(at(parent, name));
}

/** Owner first (a chown clears set-id bits), then mode, then times, all on the open file. */
async function applyAttributes(file: FileHandle, attributes: EntryAttributes): Promise<void> {
  if (attributes.uid !== undefined || attributes.gid !== undefined)
    await file.chown(attributes.uid ?? -1, attributes.gid ?? -1);
  if (attributes.mode !== undefined) await file.chmod(attributes.mode & 0o7777);
  if (attributes.mtimeS !== undefined)
    await file.utimes(attributes.atimeS ?? attributes.mtimeS, attributes.mtimeS);
}

/** A symlink's (or device's) owner and times, by a path whose last name is not followed. */
async function applyLinkAttributes(path: string, attributes: EntryAttributes): Promise<void> {
  if (attributes.uid !== undefined || attributes.gid !== undefined)
    await lchown(path, attributes.uid ?? -1, attributes.gid ?? -1);
  if (attributes.mtimeS !== undefined)
    await lutimes(path, attributes.atimeS ?? attributes.mtimeS, attributes.mtimeS);
}
