import { mkdir, open, readFile, truncate, writeFile } from 'node:fs/promises';
import { spawnSync } from 'node:child_process';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

describe('composed layers on real mounts', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    // layers it makes are gc's to take at once: this file tests collection, not in-flight holds
    env = await createTestPlatform('layers', { privateStore: true, freshLayerHoldMs: 0 });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function layerFrom(name: string, files: Record<string, string>): Promise<string> {
    const dir = join(env.dataDir, 'sources', name);
    for (const [path, text] of Object.entries(files)) {
      await mkdir(join(dir, path, '..'), { recursive: true });
      await writeFile(join(dir, path), text);
    }
    return (await env.platform.store.addLayerFromDirectory(dir, name)).digest;
  }

  it('lets a workspace layer shadow the base, and a toolkit layer add to both', async () => {
    const base = await env.platform.store.getEnvironment('busybox:latest');
    const workspace = await layerFrom('workspace', {
      'etc/group': 'workspace group\n',
      'work/repo/main.py': 'print(1)\n',
    });
    const toolkit = await layerFrom('toolkit', { 'opt/tool/run': 'tool\n' });
    await env.platform.store.putEnvironment({
      name: 'stacked',
      version: '1',
      layers: [...base.layers, workspace, toolkit],
      config: {},
    });
    await using sandbox = await env.platform.createSandbox({ environment: 'stacked:1' });
    expect((await sandbox.exec(['cat', '/etc/group', '/work/repo/main.py', '/opt/tool/run'])).stdout).toBe(
      'workspace group\nprint(1)\ntool\n',
    );
    expect((await sandbox.exec(['cat', '/etc/passwd'])).stdout).toContain('root:x:0:0');
  });

  it('shares one mount of a layer between sandboxes', async () => {
    await using first = await env.platform.createSandbox({ environment: 'busybox:latest' });
    await using second = await env.platform.createSandbox({ environment: 'busybox:latest' });
    const digest = first.layers[0]?.digest.slice('sha256:'.length) ?? '';
    const mounts = (await readFile('/proc/self/mountinfo', 'utf8'))
      .split('\n')
      .filter((line) => line.includes(join(env.dataDir, 'layers', digest)));
    expect(mounts).toHaveLength(1);
    expect(second.layers[0]?.digest).toBe(first.layers[0]?.digest);
  });

  it('packs a sandbox diff, whiteouts and opaque folders included, into a new environment', async () => {
    const sandbox = await env.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      await sandbox.exec([
        'sh',
        '-c',
        'rm /etc/group && echo new > /root/added && rm -rf /usr/sbin && mkdir /usr/sbin && touch /usr/sbin/only',
      ]);
      const { layer, environment } = await env.platform.packDiff(sandbox, { name: 'packed:1' });
      expect(environment?.layers).toEqual([...sandbox.layers.map((l) => l.digest), layer.digest]);
      expect(sandbox.state).toBe('running');
    } finally {
      await sandbox.close();
    }
    await using next = await env.platform.createSandbox({ environment: 'packed:1' });
    const seen = await next.exec(['sh', '-c', 'cat /root/added; ls /etc/group 2>&1; ls /usr/sbin']);
    expect(seen.stdout).toBe('new\nls: /etc/group: No such file or directory\nonly\n');
  });

  it('packs the diff of a sandbox that another process owns, from the CLI', async () => {
    await using sandbox = await env.platform.createSandbox({ environment: 'busybox:latest' });
    await sandbox.exec(['sh', '-c', 'echo from-cli > /root/cli']);
    const cli = spawnSync(
      'node',
      [
        resolve('dist/src/cli/main.js'),
        'layer',
        'build',
        '--from-sandbox',
        sandbox.id,
        '--name',
        'clipack:1',
      ],
      {
        env: { ...process.env, SANDGYM_DATA_DIR: env.dataDir, SANDGYM_STORE: env.platform.store.root },
        encoding: 'utf8',
      },
    );
    expect(cli.status, cli.stderr).toBe(0);
    expect(sandbox.state).toBe('running');
    expect((await sandbox.exec(['echo', 'thawed'])).stdout).toBe('thawed\n');
    await using next = await env.platform.createSandbox({ environment: 'clipack:1' });
    expect((await next.exec(['cat', '/root/cli'])).stdout).toBe('from-cli\n');
  });

  it('collects unreferenced layers by age, never one an environment or a live sandbox uses', async () => {
    const orphan = await layerFrom('orphan', { 'x/orphan': 'o' });
    const kept = await layerFrom('kept', { 'x/kept': 'k' });
    const base = await env.platform.store.getEnvironment('busybox:latest');
    await env.platform.store.putEnvironment({
      name: 'keeper',
      version: '1',
      layers: [...base.layers, kept],
      config: {},
    });
    await using live = await env.platform.createSandbox({ environment: 'keeper:1' });
    const young = await env.platform.layerGc({ minAgeMs: 60 * 60_000 });
    expect(young.removedLayers).not.toContain(orphan);
    const report = await env.platform.layerGc({ minAgeMs: 0 });
    expect(report.removedLayers).toContain(orphan);
    expect(report.removedLayers).not.toContain(kept);
    expect(report.freedBytes).toBeGreaterThan(0);
    const left = (await env.platform.store.listLayers()).map((l) => l.digest);
    expect(left).toContain(kept);
    expect(left).not.toContain(orphan);
    expect((await live.exec(['cat', '/x/kept'])).stdout).toBe('k');
  });

  it('refuses a corrupt or truncated layer before mounting it, naming the file', async () => {
    const digest = await layerFrom('fragile', { 'data/blob': 'x'.repeat(100_000) });
    const base = await env.platform.store.getEnvironment('busybox:latest');
    await env.platform.store.putEnvironment({
      name: 'fragile',
      version: '1',
      layers: [...base.layers, digest],
      config: {},
    });
    const file = join(env.platform.store.root, 'layers/sha256', `${digest.slice(7)}.erofs`);
    const handle = await open(file, 'r+');
    await handle.write(Buffer.from([0xff]), 0, 1, 5000);
    await handle.close();
    for (const damage of ['flipped byte', 'truncated']) {
      if (damage === 'truncated') await truncate(file, 4096);
      const error: unknown = await env.platform.createSandbox({ environment: 'fragile:1' }).then(
        (s) => s.close(),
        (e: unknown) => e,
      );
      expect(isSandgymError(error, 'failed_precondition'), damage).toBe(true);
      expect((error as Error).message).toMatch(new RegExp(`${file}.*corrupt or truncated`));
    }
  });
});
