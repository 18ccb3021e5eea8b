import { constants } from 'node:fs';
import { lstat, open, opendir, type FileHandle } from 'node:fs/promises';
import { posix } from 'node:path';

/** A folder opened so that a symlink, or anything but a folder, in its place fails the open. */
const FOLDER_FLAGS = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;

/**
 * Opens the folder `name` of a held folder, through the held fd: a symlink swapped in where it
 * was (the sandbox runs on while it is looked at) makes the open fail; it is never followed.
 * Undefined when it is not a folder (a file, a link, a whiteout) or is gone.
 */
async function openFolder(parent: FileHandle | string, name?: string): Promise<FileHandle | undefined> {
  const path = typeof parent === 'string' ? parent : `/proc/self/fd/${parent.fd}/${name ?? ''}`;
  return open(path, FOLDER_FLAGS).catch(() => undefined);
}

/** Python's bytecode cache folders: their `.pyc` files are no audit's concern (see {@link writtenUnder}). */
const BYTECODE_CACHE = '__pycache__';

/**
 * How deep below a prefix (or down a prefix's own path) the walk goes, holding a folder open at
 * each level: a deeper folder is reported itself. The agent makes the tree, so without a bound a
 * chain of folders would spend the node's descriptors.
 */
const MAX_DEPTH = 64;

/**
 * What an overlay upper dir holds under each of `prefixes` (absolute paths inside the sandbox):
 * its files, symlinks, whiteouts (deletions) and empty folders, as sandbox paths, at most `limit`,
 * shared fairly among the prefixes so a flood under one cannot hide another. The upper dir belongs
 * to a sandbox that may be running, so nothing in it is followed: the walk holds each folder open
 * and opens the next through it, refusing anything that is not a folder (a link or a file where a
 * folder should be is reported, not entered), so a swap under the walk can never lead it out of
 * the upper dir. On the way down to a prefix it looks names up, never lists a folder, so what the
 * agent writes elsewhere costs the audit nothing. Python's bytecode (`.pyc` files in a
 * `__pycache__` folder) is not counted: any interpreter that runs writes it, and no grader takes
 * it from a diff; anything else in such a folder is.
 */
export async function writtenUnder(
  upper: string,
  prefixes: readonly string[],
  limit: number,
): Promise<string[]> {
  const tree = prefixTree(prefixes);
  const findings = new Findings(limit, tree.prefixes);
  const root = await openFolder(upper);
  if (!root) return [];
  try {
    await walkPrefixes(root, '', tree.root, findings);
  } finally {
    await root.close();
  }
  return [...findings.found].sort();
}

/** Adds a path found under one prefix; false once that prefix's share, or the whole limit, is used. */
type Add = (path: string) => boolean;

/** What the walk found, at most `limit`, each prefix getting an equal share of it. */
class Findings {
  readonly found = new Set<string>();
  private readonly share: number;

  constructor(
    private readonly limit: number,
    prefixes: number,
  ) {
    this.share = Math.max(1, Math.floor(limit / Math.max(1, prefixes)));
  }

  get full(): boolean {
    return this.found.size >= this.limit;
  }

  /** The {@link Add} of one prefix. */
  forPrefix(): Add {
    let taken = 0;
    return (path) => {
      if (this.full || taken >= this.share) return false;
      this.found.add(path);
      taken++;
      return !this.full && taken < this.share;
    };
  }
}

/** The prefixes as a tree of their names: a node that ends a prefix takes everything below it. */
interface PrefixNode {
  whole: boolean;
  below: Map<string, PrefixNode>;
}

/** The tree of `prefixes` (each cut to {@link MAX_DEPTH} names, which only widens it), and how many ends it has. */
function prefixTree(prefixes: readonly string[]): { root: PrefixNode; prefixes: number } {
  const root: PrefixNode = { whole: false, below: new Map() };
  for (const prefix of prefixes) {
    let node = root;
    for (const part of posix.normalize(`/${prefix}`).split('/').filter(Boolean).slice(0, MAX_DEPTH)) {
      let next = node.below.get(part);
      if (!next) node.below.set(part, (next = { whole: false, below: new Map() }));
      node = next;
    }
    node.whole = true;
  }
  const ends = (node: PrefixNode): number =>
    node.whole ? 1 : [...node.below.values()].reduce((sum, child) => sum + ends(child), 0);
  return { root, prefixes: ends(root) };
}

/**
 * Below the held folder `folder` (sandbox path `at`), what the prefixes of `node` hold; false
 * once the whole limit is reached. A name on the way that is not a folder (a file, a link, a
 * whiteout, or a folder swapped for one under the walk) is reported itself, never entered.
 */
async function walkPrefixes(
  folder: FileHandle,
  at: string,
  node: PrefixNode,
  findings: Findings,
): Promise<boolean> {
  if (node.whole) {
    await walk(folder, at, 0, findings.forPrefix());
    return !findings.full;
  }
  const names = [...node.below.keys()];
  // looked up at once: the few names the prefixes go through, however many the agent wrote beside them
  const there = await Promise.all(
    names.map((name) =>
      lstat(`/proc/self/fd/${folder.fd}/${name}`).then(
        () => true,
        () => false,
      ),
    ),
  );
  for (const [i, name] of names.entries()) {
    if (!there[i]) continue; // the sandbox never wrote there
    const path = `${at}/${name}`;
    const next = await openFolder(folder, name);
    try {
      if (next) await walkPrefixes(next, path, node.below.get(name)!, findings);
      else findings.forPrefix()(path);
    } finally {
      await next?.close();
    }
    if (findings.full) return false;
  }
  return true;
}

/**
 * Adds every leaf below the held folder `folder` (sandbox path `dir`, `depth` levels below its
 * prefix); false once `add` says stop. The listing is read as it comes, so a folder of millions
 * of entries costs no more memory than a few, and no more time than the share allows.
 */
async function walk(
  folder: FileHandle,
  dir: string,
  depth: number,
  add: Add,
  inCache = false,
): Promise<boolean> {
  if (depth >= MAX_DEPTH) return add(dir);
  const listing = await opendir(`/proc/self/fd/${folder.fd}`, { bufferSize: 64 }).catch(() => undefined);
  if (!listing) return true;
  let entries = 0;
  for await (const entry of listing) {
    entries++;
    if (inCache && entry.isFile() && entry.name.endsWith('.pyc')) continue;
    const path = `${dir}/${entry.name}`;
    const child = entry.isDirectory() ? await openFolder(folder, entry.name) : undefined;
    let more: boolean;
    try {
      more = child ? await walk(child, path, depth + 1, add, entry.name === BYTECODE_CACHE) : add(path);
    } finally {
      await child?.close();
    }
    // leaving the loop closes the listing
    if (!more) return false;
  }
  return entries > 0 || dir === '' || add(dir);
}
