import { createHash } from 'node:crypto';
import { lstatSync, readFileSync, readdirSync, readlinkSync, type Stats } from 'node:fs';
import { join } from 'node:path';
import type { TestTarEntry } from '../support/tar-writer.ts';

/** A seeded PRNG (mulberry32): the same seed makes the same archives, so a failure can be replayed. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Where a fuzz run's roots sit: `box/roots/<root>`, beside `box/canary` (files an escape would
 * read, link, change or remove). Every link the generator makes out of a root leads into the
 * box, so even a broken extractor can only harm the box.
 */
export interface FuzzBox {
  box: string;
  /** What `box/canary/secret` holds; no generated entry carries these bytes. */
  secret: string;
}

/** How deep a root is below the box (`box/roots/<root>`). */
const ROOT_DEPTH = 2;

const PLAIN_NAMES = ['a', 'b', 'd', 'lib', 'usr', 'secret', 'canary', 'dir', 'x y'];
const ODD_NAMES = [
  '.',
  '..',
  '',
  'N'.repeat(120), // longer than a ustar name: pax or GNU long names
  'L'.repeat(255), // the longest name a folder holds
  'M'.repeat(256), // one byte too long
  'é'.repeat(128), // 256 bytes in 128 characters
  '.wh.a',
  '.wh..',
  '.wh...',
  '.wh.',
  '.wh..wh..opq',
  '.wh..wh.plnk',
  `.wh.${'W'.repeat(260)}`,
  'nul\0name',
];

/** One hostile archive: plain entries mixed with the moves that have escaped extractors before. */
export function generateArchive(random: () => number, { box }: FuzzBox): TestTarEntry[] {
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
  const chance = (p: number): boolean => random() < p;
  const used: string[] = [];
  const files: string[] = [];
  const name = (): string => (chance(0.93) ? pick(PLAIN_NAMES) : pick(ODD_NAMES));
  const path = (): string => {
    if (used.length > 0 && chance(0.2)) return pick(used); // duplicates replace each other
    const parts = Array.from({ length: 1 + Math.floor(random() * 3) }, name);
    const joined = parts.join('/');
    const shaped = chance(0.02) ? `/${joined}` : chance(0.05) ? `./${joined}` : joined;
    used.push(shaped);
    return shaped;
  };
  const depthOf = (entryPath: string): number =>
    entryPath.split('/').filter((p) => p && p !== '.').length - 1;
  // where links out of the root go: the canary, by absolute path or by climbing out of the root
  const outward = (from: string, rest: string): string =>
    chance(0.5) ? `${box}/${rest}` : `${'../'.repeat(Math.max(depthOf(from), 0) + ROOT_DEPTH)}${rest}`;
  const longNames = (): 'pax' | 'gnu' => (chance(0.5) ? 'pax' : 'gnu');
  const entries: TestTarEntry[] = [];
  const push = (entry: TestTarEntry): void => {
    entries.push({ ...entry, longNames: longNames() });
  };

  const moves: (() => void)[] = [
    // the reported escape: a folder with a file, the folder replaced by a symlink out, a hard
    // link to the file through it
    () => {
      const folder = path();
      const [out, file] = pick([
        ['canary', 'secret'],
        ['canary/dir', 'inner'],
        ['canary', 'dir/inner'],
        ['', 'canary/secret'],
      ] as const);
      push({ path: `${folder}/`, type: 'dir' });
      push({ path: `${folder}/${file}`, data: 'decoy' });
      push({ path: folder, type: 'symlink', linkTarget: outward(folder, out) });
      push({ path: path(), type: 'hardlink', linkTarget: `${folder}/${file}` });
    },
    // writing, whiting out or marking opaque through a symlink out
    () => {
      const folder = path();
      push({ path: folder, type: 'symlink', linkTarget: outward(folder, 'canary') });
      push({
        path: `${folder}/${pick(['planted', 'secret', '.wh.secret', '.wh..wh..opq', 'dir/x', '.wh.dir'])}`,
        type: pick(['file', 'dir', 'symlink'] as const),
        data: 'planted',
        linkTarget: 'x',
      });
    },
    // whiteouts of ".", "..", "" at any depth
    () => {
      const folder = chance(0.5) ? '' : `${path()}/`;
      if (folder) push({ path: folder, type: 'dir' });
      push({ path: `${folder}${pick(['.wh..', '.wh...', '.wh.', '.wh../x', '.wh.../..'])}` });
    },
    // hard links straight at the canary
    () => {
      const link = path();
      push({
        path: link,
        type: 'hardlink',
        linkTarget: pick([
          `${box}/canary/secret`,
          `${'../'.repeat(ROOT_DEPTH)}canary/secret`,
          'canary/secret',
        ]),
      });
    },
    // a hard link to a symlink out, or to a file since replaced by one
    () => {
      const target = path();
      if (chance(0.5)) push({ path: target, data: 'soon replaced' });
      push({ path: target, type: 'symlink', linkTarget: outward(target, 'canary/secret') });
      push({ path: path(), type: 'hardlink', linkTarget: target });
    },
    // devices and FIFOs
    () => push({ path: path(), type: pick(['char', 'block', 'fifo'] as const) }),
    // one path as every kind in turn
    () => {
      const target = path();
      for (const type of ['file', 'dir', 'symlink', 'dir', 'file', 'hardlink'] as const)
        push({ path: type === 'dir' ? `${target}/` : target, type, data: 'turn', linkTarget: 'a' });
    },
    // paths longer than a layer can hold
    () => push({ path: Array.from({ length: 18 }, () => 'P'.repeat(240)).join('/'), data: 'deep' }),
    // folders nested past the tree's bound (256), as a file, a folder or a whiteout at the bottom
    () =>
      push({
        path: `${'d/'.repeat(250 + Math.floor(random() * 20))}${pick(['f', 'sub/', '.wh.f'])}`,
        type: 'file',
        data: 'deep',
      }),
    // an absolute name, and a hard link to it by its absolute name: both beneath the root
    () => {
      const target = `/${path().replace(/^[./]+/, '')}`;
      push({ path: target, data: 'absolute' });
      push({ path: path(), type: 'hardlink', linkTarget: target });
    },
    // plain entries
    () => {
      const type = pick(['file', 'file', 'dir', 'symlink', 'hardlink'] as const);
      const entryPath = path();
      if (type === 'file') files.push(entryPath);
      push({
        path: type === 'dir' && chance(0.5) ? `${entryPath}/` : entryPath,
        type,
        data: `data ${Math.floor(random() * 1000)}`,
        mode: pick([0o644, 0o755, 0o4755, 0o600, 0o777]),
        linkTarget:
          type === 'hardlink'
            ? files.length > 0 && chance(0.9)
              ? pick(files)
              : pick([...used, 'a', '..', '.', ''])
            : pick([
                'a',
                '../a',
                '..',
                '.',
                box,
                `${box}/canary/dir`,
                'secret',
                'X'.repeat(300),
                outward(entryPath, 'canary'),
              ]),
      });
    },
  ];
  // most archives make hostile moves among plain entries; some are all plain, and extract
  const hostility = chance(0.6) ? 0.3 : 0;
  const count = 2 + Math.floor(random() * 8);
  for (let i = 0; i < count; i++) (chance(hostility) ? pick(moves) : moves[moves.length - 1]!)();
  return entries;
}

function describeEntry(path: string, stats: Stats): string {
  const kind = stats.isSymbolicLink()
    ? `link ${readlinkSync(path)}`
    : stats.isFile()
      ? `file ${createHash('sha256').update(readFileSync(path)).digest('hex')}`
      : stats.isDirectory()
        ? 'dir'
        : 'other';
  return `${kind} mode ${stats.mode} ino ${stats.ino} links ${stats.nlink} owner ${stats.uid}:${stats.gid} size ${stats.size} mtime ${stats.mtimeMs} ctime ${stats.ctimeMs}`;
}

/**
 * Everything in a folder but `skip` (a root under test), with identity, content and metadata
 * (ctime too: a link made or an xattr set on a canary changes it): equal before and after means
 * nothing beside the root was created, removed, changed, linked or marked.
 */
export function fingerprint(dir: string, skip: string): Map<string, string> {
  const found = new Map<string, string>();
  const visit = (path: string): void => {
    const stats = lstatSync(path);
    found.set(path, describeEntry(path, stats));
    if (stats.isDirectory())
      for (const name of readdirSync(path)) if (join(path, name) !== skip) visit(join(path, name));
  };
  visit(dir);
  return found;
}

/**
 * What is wrong inside a root after extraction: it is no longer a folder, a file in it holds
 * the canary's bytes, or a file in it shares its inode with something outside (it has more
 * links than the root holds).
 */
export function problemsInRoot(root: string, secret: string): string[] {
  const problems: string[] = [];
  if (!lstatSync(root).isDirectory()) return [`the root ${root} is no longer a folder`];
  const linksInRoot = new Map<number, { count: number; nlink: number; path: string }>();
  const visit = (dir: string): void => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      const stats = lstatSync(path);
      if (stats.isDirectory()) visit(path);
      if (!stats.isFile()) continue;
      if (readFileSync(path).includes(secret)) problems.push(`${path} holds the canary's secret`);
      const seen = linksInRoot.get(stats.ino) ?? { count: 0, nlink: stats.nlink, path };
      linksInRoot.set(stats.ino, { ...seen, count: seen.count + 1 });
    }
  };
  visit(root);
  for (const { count, nlink, path } of linksInRoot.values())
    if (nlink > count)
      problems.push(`${path} has ${nlink} links but the root holds ${count}: it is linked outside`);
  return problems;
}
