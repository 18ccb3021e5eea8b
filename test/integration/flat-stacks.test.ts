import { randomBytes } from 'node:crypto';
import { mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { LayerImage } from '../../src/backends/contract.ts';
import { buildErofsImage } from '../../src/backends/host/erofs.ts';
import { LayerMounts } from '../../src/backends/host/layer-mounts.ts';
import { sha256OfFile } from '../../src/backends/host/layer-verify.ts';
import { mountOverlay } from '../../src/backends/host/overlay-mount.ts';
import { agentBinaryPath } from '../../src/backends/host/paths.ts';
import { processIdentity } from '../../src/backends/host/processes.ts';
import { runProgram } from '../../src/backends/host/run-program.ts';
import { TEST_DATA_ROOT } from '../support/platform.ts';

/** A layer of its own files; `deleted` become overlay whiteouts (character devices 0/0). */
async function layer(
  dir: string,
  n: number,
  files: Record<string, string>,
  deleted: string[] = [],
): Promise<LayerImage> {
  const tree = join(dir, `tree-${n}`);
  await mkdir(tree, { recursive: true });
  for (const [path, text] of Object.entries(files)) {
    await mkdir(join(tree, path, '..'), { recursive: true });
    await writeFile(join(tree, path), text);
  }
  for (const path of deleted) {
    await mkdir(join(tree, path, '..'), { recursive: true });
    await runProgram('mknod', [join(tree, path), 'c', '0', '0']);
  }
  const path = join(dir, `layer-${n}.erofs`);
  await buildErofsImage(tree, path);
  return { digest: await sha256OfFile(path), path, sizeBytes: (await stat(path)).size };
}

/** `count` layers, each adding /n/<i>; layer 3 deletes /n/1, and each layer's size is padded by `padBytes`. */
async function stackOf(dir: string, tag: string, count: number, padBytes = 0): Promise<LayerImage[]> {
  const layers: LayerImage[] = [];
  for (let i = 1; i <= count; i++) {
    const files: Record<string, string> = { [`n/${i}`]: `${tag}${i}\n` };
    if (padBytes) files[`pad/${i}`] = randomBytes(padBytes).toString('base64');
    layers.push(await layer(join(dir, tag), i, files, i === 3 ? ['n/1'] : []));
  }
  return layers;
}

describe('flattened layer stacks', () => {
  let dir: string;
  let mounts: LayerMounts;

  async function layerMounts(capBytes?: number): Promise<LayerMounts> {
    const self = await processIdentity(process.pid);
    return new LayerMounts(
      join(dir, 'mounts'),
      agentBinaryPath(),
      { mode: 'ondemand', verify: 'digest', copiesDir: join(dir, 'copies') },
      self!,
      { dir: join(dir, 'flat'), maxDepth: 17, ...(capBytes === undefined ? {} : { capBytes }) },
    );
  }

  /** The merged tree's /n of a stack as the mounts give it. */
  async function mergedNames(layers: LayerImage[]): Promise<{ points: number; names: string[] }> {
    const points = await mounts.acquire(layers);
    const view = join(dir, `view-${randomBytes(4).toString('hex')}`);
    await mkdir(view);
    try {
      await mountOverlay(view, points);
      try {
        return {
          points: points.length,
          names: (await readdir(join(view, 'n'))).sort((a, b) => Number(a) - Number(b)),
        };
      } finally {
        await runProgram('umount', [view]);
      }
    } finally {
      mounts.release(layers);
      await rm(view, { recursive: true, force: true });
    }
  }

  beforeEach(async () => {
    dir = join(TEST_DATA_ROOT, `flat-stacks-${randomBytes(4).toString('hex')}`);
    await mkdir(dir, { recursive: true });
  });

  afterEach(async () => {
    await mounts?.unmountIdle();
    const left = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((l) => l.includes(dir));
    await rm(dir, { recursive: true, force: true });
    expect(left).toEqual([]);
  });

  it('mounts a 40-layer stack as its flattened base and the layers above, the same tree', async () => {
    mounts = await layerMounts();
    const layers = await stackOf(dir, 'a', 40);
    // 32 layers in two chunks' image (the second made from the first's), 8 above it
    const flat = await mergedNames(layers);
    expect(flat.points).toBe(9);
    const expected = Array.from({ length: 40 }, (_, i) => String(i + 1)).filter((n) => n !== '1');
    expect(flat.names).toEqual(expected);
    expect((await readdir(join(dir, 'flat'))).filter((n) => n.endsWith('.erofs'))).toHaveLength(2);
    // the same stack again: the cached image, nothing made anew
    expect((await mergedNames(layers)).names).toEqual(expected);
    expect((await readdir(join(dir, 'flat'))).filter((n) => n.endsWith('.erofs'))).toHaveLength(2);
  });

  it('keeps flattened images under the cap: refuses while they are mounted, evicts idle ones', async () => {
    // layers of ~64 KiB of noise: one 16-layer image is ~1 MiB, and the cap holds about one
    mounts = await layerMounts(1.5 * 2 ** 20);
    const first = await stackOf(dir, 'a', 20, 64 * 1024);
    const second = await stackOf(dir, 'b', 20, 64 * 1024);
    expect((await mergedNames(first)).points).toBe(5);
    // the first's image stays mounted (idle until gc): a tenant's second deep stack may not pile on
    await expect(mergedNames(second)).rejects.toMatchObject({ code: 'resource_exhausted' });
    await mounts.unmountIdle();
    expect((await mergedNames(second)).points).toBe(5);
    const images = (await readdir(join(dir, 'flat'))).filter((n) => n.endsWith('.erofs'));
    expect(images).toHaveLength(1); // the first's, least recently used, made room
  });
});
