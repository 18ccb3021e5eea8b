import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildLayerFromOci, buildLayerFromTar } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { tarArchive, type TestTarEntry } from '../support/tar-writer.ts';

describe('building layers from archives', () => {
  let env: TestPlatform;
  let count = 0;

  beforeAll(async () => {
    env = await createTestPlatform('layer-build', { privateStore: true });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function archive(entries: TestTarEntry[], gzip = false): Promise<string> {
    const path = join(env.dataDir, `archive-${count++}.tar${gzip ? '.gz' : ''}`);
    await writeFile(path, tarArchive(entries, { gzip }));
    return path;
  }

  async function onBusybox(digest: string): Promise<string> {
    const base = await env.platform.store.getEnvironment('busybox:latest');
    const name = `built${count++}`;
    await env.platform.store.putEnvironment({
      name,
      version: '1',
      layers: [...base.layers, digest],
      config: {},
    });
    return `${name}:1`;
  }

  it('keeps files, folders, symlinks and hard links, from plain and gzip tars', async () => {
    for (const gzip of [false, true]) {
      const path = await archive(
        [
          { path: './work/', type: 'dir' },
          { path: './work/run.sh', data: 'echo ran\n', mode: 0o755 },
          { path: 'work/link', type: 'symlink', linkTarget: 'run.sh' },
          { path: 'work/hard', type: 'hardlink', linkTarget: 'work/run.sh' },
        ],
        gzip,
      );
      const layer = await buildLayerFromTar(env.platform.store, path);
      await using sandbox = await env.platform.createSandbox({ environment: await onBusybox(layer.digest) });
      const seen = await sandbox.exec([
        'sh',
        '-c',
        '/work/link; stat -c "%a %h" /work/run.sh; readlink /work/link',
      ]);
      expect(seen.stdout).toBe('ran\n755 2\nrun.sh\n');
    }
  });

  it('turns whiteouts into overlay whiteouts that hide base files', async () => {
    const layer = await buildLayerFromTar(
      env.platform.store,
      await archive([
        { path: 'etc/.wh.group' },
        { path: 'usr/sbin/.wh..wh..opq' },
        { path: 'usr/sbin/mine', data: 'x' },
      ]),
    );
    await using sandbox = await env.platform.createSandbox({ environment: await onBusybox(layer.digest) });
    const seen = await sandbox.exec(['sh', '-c', 'ls /etc/group 2>&1; ls /usr/sbin; ls /etc/passwd']);
    expect(seen.stdout).toBe('ls: /etc/group: No such file or directory\nmine\n/etc/passwd\n');
  });

  it('refuses archives that try to leave the tree or plant devices, and stores nothing', async () => {
    const attacks: [string, TestTarEntry[], RegExp][] = [
      ['dot-dot', [{ path: 'a/../../escape', data: 'x' }], /".." would leave the tree/],
      [
        'hard link out',
        [{ path: 'passwd', type: 'hardlink', linkTarget: '../../etc/passwd' }],
        /".." would leave the tree/,
      ],
      [
        'hard link to nothing',
        [{ path: 'x', type: 'hardlink', linkTarget: 'etc/shadow' }],
        /not an earlier file/,
      ],
      ['device', [{ path: 'dev/sda', type: 'char' }], /device nodes/],
      [
        'symlink slip',
        [
          { path: 'out', type: 'symlink', linkTarget: '/tmp' },
          { path: 'out/planted', data: 'x' },
        ],
        /goes through the symlink "out"/,
      ],
    ];
    const before = (await env.platform.store.listLayers()).length;
    for (const [name, entries, message] of attacks) {
      const path = await archive(entries);
      await expect(buildLayerFromTar(env.platform.store, path), name).rejects.toThrow(message);
    }
    expect((await env.platform.store.listLayers()).length).toBe(before);
    // an absolute name means the same name beneath the root, as Docker reads it: never the host's
    const absolute = await buildLayerFromTar(
      env.platform.store,
      await archive([{ path: '/etc/cron.d/evil', data: 'x' }]),
    );
    expect(existsSync('/etc/cron.d/evil')).toBe(false);
    expect(absolute.sizeBytes).toBeGreaterThan(0);
  });

  it('flattens an OCI image (docker save and OCI layout) with whiteouts applied', async () => {
    const base = tarArchive([
      { path: 'srv/', type: 'dir' },
      { path: 'srv/a', data: 'a' },
      { path: 'srv/b', data: 'b' },
      { path: 'srv/dir/old', data: 'old' },
    ]);
    const top = tarArchive(
      [{ path: 'srv/.wh.a' }, { path: 'srv/dir/.wh..wh..opq' }, { path: 'srv/dir/new', data: 'new' }],
      { gzip: true },
    );
    const config = JSON.stringify({
      config: { Env: ['PATH=/bin:/usr/bin', 'MODE=oci'], WorkingDir: '/srv' },
    });
    const sha = (data: Buffer | string): string => createHash('sha256').update(data).digest('hex');
    const dockerSave = tarArchive([
      {
        path: 'manifest.json',
        data: JSON.stringify([{ Config: 'config.json', Layers: ['l1/layer.tar', 'l2/layer.tar'] }]),
      },
      { path: 'config.json', data: config },
      { path: 'l1/layer.tar', data: base },
      { path: 'l2/layer.tar', data: top },
    ]);
    const layout = join(env.dataDir, 'oci-layout');
    await mkdir(join(layout, 'blobs/sha256'), { recursive: true });
    const manifest = JSON.stringify({
      config: { digest: `sha256:${sha(config)}` },
      layers: [
        { digest: `sha256:${sha(base)}`, mediaType: 'application/vnd.oci.image.layer.v1.tar' },
        { digest: `sha256:${sha(top)}`, mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip' },
      ],
    });
    for (const blob of [config, manifest, base, top])
      await writeFile(join(layout, 'blobs/sha256', sha(blob)), blob);
    await writeFile(
      join(layout, 'index.json'),
      JSON.stringify({ manifests: [{ digest: `sha256:${sha(manifest)}` }] }),
    );
    const savePath = join(env.dataDir, 'image.tar');
    await writeFile(savePath, dockerSave);
    const built = [
      await buildLayerFromOci(env.platform.store, savePath),
      await buildLayerFromOci(env.platform.store, layout),
    ];
    expect(built[1]?.layer.digest).toBe(built[0]?.layer.digest);
    expect(built[0]?.config).toEqual({
      env: { PATH: '/bin:/usr/bin', MODE: 'oci' },
      workdir: '/srv',
      user: 'root',
    });
    await using sandbox = await env.platform.createSandbox({
      environment: await onBusybox(built[0]!.layer.digest),
    });
    expect((await sandbox.exec(['find', '/srv'])).stdout.split('\n').sort().join(' ').trim()).toBe(
      '/srv /srv/b /srv/dir /srv/dir/new',
    );
  });

  it('refuses a truncated or non-tar file with a clear error', async () => {
    const whole = tarArchive([{ path: 'big', data: 'y'.repeat(5000) }]);
    const truncated = join(env.dataDir, 'truncated.tar');
    await writeFile(truncated, whole.subarray(0, 2000));
    await expect(buildLayerFromTar(env.platform.store, truncated)).rejects.toThrow(/truncated/);
    const notTar = join(env.dataDir, 'not.tar');
    await writeFile(notTar, 'hello world '.repeat(100));
    await expect(buildLayerFromTar(env.platform.store, notTar)).rejects.toThrow(/not a tar archive/);
  });
});
