import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Platform, buildLayerFromTar, type LocalPlatform } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { tarArchive } from '../support/tar-writer.ts';

/**
 * Every path of the root with its type, mode and owner, a checksum of each file and the target
 * of each symlink. Folder sizes are left out: they are the filesystem's, not the tree's.
 */
const TREE = [
  'find / -xdev | sort | while read -r p; do',
  `stat -c '%n %F %a %u:%g' "$p";`,
  'if [ -L "$p" ]; then readlink "$p"; elif [ -f "$p" ]; then md5sum < "$p"; fi;',
  'done',
].join(' ');

describe('loading modes', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('load-modes', { privateStore: true });
    const archive = join(env.dataDir, 'toolkit.tar');
    await writeFile(
      archive,
      tarArchive([
        { path: 'etc/.wh.group' },
        { path: 'usr/sbin/.wh..wh..opq' },
        { path: 'usr/sbin/tool', data: '#!/bin/sh\necho tool\n', mode: 0o755 },
        { path: 'opt/data/big', data: 'z'.repeat(300_000) },
      ]),
    );
    const layer = await buildLayerFromTar(env.platform.store, archive);
    const base = await env.platform.store.getEnvironment('busybox:latest');
    await env.platform.store.putEnvironment({
      name: 'modes',
      version: '1',
      layers: [...base.layers, layer.digest],
      config: {},
    });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('give identical sandbox file trees in ondemand, eager and tar modes', async () => {
    const trees: Record<string, string> = {};
    for (const loadMode of ['ondemand', 'eager', 'tar'] as const) {
      const platform: LocalPlatform = await Platform.local({
        dataDir: join(env.dataDir, `node-${loadMode}`),
        storeDir: env.platform.store.root,
        loadMode,
      });
      try {
        await using sandbox = await platform.createSandbox({ environment: 'modes:1' });
        const listing = await sandbox.exec(['sh', '-c', TREE], { outputCapBytes: 16 * 1024 * 1024 });
        expect(listing.exitCode, listing.stderr).toBe(0);
        trees[loadMode] = listing.stdout;
      } finally {
        await platform.close();
      }
    }
    expect(trees['ondemand']).toContain('/usr/sbin/tool regular file 755 0:0');
    expect(trees['ondemand']).not.toContain('/etc/group ');
    expect(trees['ondemand']?.split('\n').length).toBeGreaterThan(300);
    expect(trees['eager']).toBe(trees['ondemand']);
    expect(trees['tar']).toBe(trees['ondemand']);
  });
});
