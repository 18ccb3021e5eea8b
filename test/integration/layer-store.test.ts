import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readdir, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { LayerStore } from '../../src/platform/index.ts';

describe('layer store', () => {
  let dir: string;
  let store: LayerStore;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sandgym-store-'));
    store = await LayerStore.open(join(dir, 'store'));
  });

  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  async function tree(name: string, files: Record<string, string>): Promise<string> {
    const root = join(dir, name);
    for (const [path, text] of Object.entries(files)) {
      await mkdir(join(root, path, '..'), { recursive: true });
      await writeFile(join(root, path), text);
    }
    return root;
  }

  it('addresses a layer by the sha256 of its bytes, the same for the same tree', async () => {
    // the same names, contents, modes and times (a layer keeps its files' times), built apart
    const sameTimes = async (root: string): Promise<string> => {
      for (const path of ['etc/x', 'bin/y', 'etc', 'bin', ''])
        await utimes(join(root, path), 1_700_000_000, 1_700_000_000);
      return root;
    };
    const a = await store.addLayerFromDirectory(
      await sameTimes(await tree('a', { 'etc/x': 'one', 'bin/y': 'two' })),
      'test a',
    );
    const b = await store.addLayerFromDirectory(
      await sameTimes(await tree('b', { 'etc/x': 'one', 'bin/y': 'two' })),
      'test b',
    );
    const c = await store.addLayerFromDirectory(await tree('c', { 'etc/x': 'changed' }), 'test c');
    expect(a.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(b.digest).toBe(a.digest);
    expect(c.digest).not.toBe(a.digest);
    expect((await store.listLayers()).map((l) => l.digest).sort()).toEqual([a.digest, c.digest].sort());
    expect(await store.getLayer(c.digest)).toMatchObject({
      createdFrom: 'test c',
      mediaType: 'application/vnd.sandgym.layer.v1.erofs',
    });
  });

  it('survives concurrent writers of the same layer and leaves no temp files', async () => {
    const source = await tree('same', { 'data/file': 'x'.repeat(10000) });
    const results = await Promise.all(
      [1, 2, 3, 4].map(() => store.addLayerFromDirectory(source, 'concurrent')),
    );
    expect(new Set(results.map((r) => r.digest)).size).toBe(1);
    expect(await readdir(join(store.root, 'tmp'))).toEqual([]);
  });

  it('leaves no partial layer when the disk fills during a build', async () => {
    const small = join(dir, 'small');
    await mkdir(small);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', small]);
    try {
      const full = await LayerStore.open(join(small, 'store'));
      const big = await tree('big', { 'data/random': randomBytes(3 * 1024 * 1024).toString('base64') });
      await expect(full.addLayerFromDirectory(big, 'too big')).rejects.toThrow(
        /mkfs\.erofs .*failed|No space/,
      );
      expect(await full.listLayers()).toEqual([]);
      expect(await readdir(join(full.root, 'tmp'))).toEqual([]);
      expect(await readdir(join(full.root, 'layers/sha256'))).toEqual([]);
    } finally {
      execFileSync('umount', [small]);
    }
  });

  it('records versioned environments over stored layers', async () => {
    const base = await store.addLayerFromDirectory(await tree('base', { 'bin/sh': '#' }), 'base');
    await store.putEnvironment({
      name: 'demo',
      version: '1',
      layers: [base.digest],
      config: { env: { A: 'b' } },
    });
    const environment = await store.getEnvironment('demo:1');
    expect(environment.config).toEqual({ env: { A: 'b' }, workdir: '/', user: 'root' });
    const images = await store.layerImages(environment);
    expect(images[0]?.path).toMatch(/\.erofs$/);
    await expect(
      store.putEnvironment({ name: 'demo', version: '2', layers: [`sha256:${'0'.repeat(64)}`], config: {} }),
    ).rejects.toThrow(/is not in the store/);
    await expect(store.getEnvironment('demo:9')).rejects.toThrow(
      /Unknown environment "demo:9"; known: demo:1/,
    );
  });
});
