import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { writeFileAtomic } from '../../src/common/index.ts';
import { ManifestCache } from '../../src/platform/store/manifest-cache.ts';

describe('manifest cache', () => {
  it('parses once, rereads a replaced file, and hands out copies', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'sandgym-manifests-'));
    try {
      let parses = 0;
      const cache = new ManifestCache((json) => {
        parses++;
        return json as { layers: string[] };
      });
      const path = join(dir, 'env.json');
      expect(await cache.read(path)).toBeUndefined();
      await writeFileAtomic(path, JSON.stringify({ layers: ['a'] }));
      const first = await cache.read(path);
      first?.layers.push('changed by a caller');
      expect(await cache.read(path)).toEqual({ layers: ['a'] });
      expect(parses).toBe(1);
      // written the way every manifest is (a new file renamed over the old): read again
      await writeFileAtomic(path, JSON.stringify({ layers: ['b'] }));
      expect(await cache.read(path)).toEqual({ layers: ['b'] });
      // rewritten in place with other content, of another size: read again too
      await writeFile(path, JSON.stringify({ layers: ['c', 'd'] }));
      expect(await cache.read(path)).toEqual({ layers: ['c', 'd'] });
      expect(parses).toBe(3);
      await rm(path);
      expect(await cache.read(path)).toBeUndefined();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('lets a parse error through, and caches nothing for it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'sandgym-manifests-'));
    try {
      const cache = new ManifestCache((json, path) => {
        if (typeof json !== 'object') throw new Error(`bad manifest ${path}`);
        return json;
      });
      const path = join(dir, 'env.json');
      await writeFile(path, '7');
      await expect(cache.read(path)).rejects.toThrow(`bad manifest ${path}`);
      await writeFileAtomic(path, '{}');
      expect(await cache.read(path)).toEqual({});
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
