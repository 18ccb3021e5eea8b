import { readFileSync } from 'node:fs';
import { readdir, writeFile } from 'node:fs/promises';
import { spawnSync } from 'node:child_process';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { TestRegistry, writeOciLayout } from '../support/registry.ts';
import type { TestTarEntry } from '../support/tar-writer.ts';

/** A base layer any image of these tests shares: busybox and a few of its applets. */
function busyboxLayer(): TestTarEntry[] {
  return [
    { path: 'bin/', type: 'dir' },
    { path: 'bin/busybox', data: readFileSync('/bin/busybox'), mode: 0o755 },
    ...['sh', 'cat', 'echo', 'ls', 'pwd', 'id'].map((applet): TestTarEntry => ({
      path: `bin/${applet}`,
      type: 'symlink',
      linkTarget: 'busybox',
    })),
    { path: 'etc/', type: 'dir' },
    { path: 'tmp/', type: 'dir', mode: 0o1777 },
  ];
}

/** FROM an image in an OCI registry on loopback: pulled with credentials, cached by digest. */
describe('FROM pulls from an OCI registry', () => {
  let env: TestPlatform;
  let registry: TestRegistry;
  let authFile: string;
  let digest: string;

  beforeAll(async () => {
    env = await createTestPlatform('registry-pull', { privateStore: true });
    registry = await TestRegistry.start(join(env.dataDir, 'registry'));
    authFile = await registry.authFile(join(env.dataDir, 'docker-config.json'));
    const layout = join(env.dataDir, 'image');
    await writeOciLayout(layout, {
      layers: [
        busyboxLayer(),
        [
          { path: 'etc/marker', data: 'from the registry\n' },
          { path: 'work/', type: 'dir' },
        ],
      ],
      config: { Env: ['PATH=/bin', 'FLAVOUR=pulled'], WorkingDir: '/work', Labels: { team: 'tools' } },
    });
    digest = await registry.push(layout, 'team/tool', '1');
  });

  afterAll(async () => {
    await registry?.stop();
    await env?.[Symbol.asyncDispose]();
  });

  async function dockerfile(name: string, text: string): Promise<string> {
    const path = join(env.dataDir, name);
    await writeFile(path, text);
    return path;
  }

  it('pulls with the credentials of a docker config, then reuses the digest without asking again', async () => {
    const file = await dockerfile(
      'Dockerfile.pull',
      `FROM ${registry.host}/team/tool:1\nRUN cat /etc/marker > here && echo "$FLAVOUR" >> here\n`,
    );
    // without credentials: a clear error that says what the registry wants, and no environment
    await expect(env.platform.buildFromDockerfile({ file, name: 'pulled:anon' })).rejects.toThrow(
      /line 1: FROM .*team\/tool:1: not in the store and not pulled .*credentials/,
    );
    expect(env.platform.store.hasEnvironment('pulled:anon')).toBe(false);

    const built = await env.platform.buildFromDockerfile({
      file,
      name: 'pulled:one',
      registry: { authFile },
    });
    expect(built.notes.join('\n')).toContain(`FROM ${registry.host}/team/tool:1: ${digest} pulled from`);
    expect(built.environment.config).toMatchObject({ workdir: '/work', env: { FLAVOUR: 'pulled' } });
    expect(built.environment.image?.labels).toEqual({ team: 'tools' });
    {
      await using sandbox = await env.platform.createSandbox({ environment: 'pulled:one' });
      expect((await sandbox.exec(['cat', '/work/here'])).stdout).toBe('from the registry\npulled\n');
    }
    // the blobs are kept by digest in the project's own cache, the image once per manifest digest
    const blobs = await readdir(
      join(env.platform.store.root, 'projects', 'default', 'cache', 'oci-blobs', 'sha256'),
    );
    expect(blobs.length).toBeGreaterThanOrEqual(3);
    // by hand, from the command line: the same digest, already in the store
    const pull = spawnSync(
      'node',
      [
        resolve('dist/src/cli/main.js'),
        'layer',
        'pull',
        `${registry.host}/team/tool:1`,
        '--registry-auth',
        authFile,
      ],
      {
        env: { ...process.env, SANDGYM_DATA_DIR: env.dataDir, SANDGYM_STORE: env.platform.store.root },
        encoding: 'utf8',
      },
    );
    expect(pull.status, pull.stderr).toBe(0);
    expect(pull.stdout.trim()).toBe(`127.0.0.1-${registry.host.split(':')[1]}-team-tool:${digest.slice(7)}`);
    expect(pull.stderr).toContain('already in the store');
    const again = await env.platform.buildFromDockerfile({
      file,
      name: 'pulled:two',
      registry: { authFile },
    });
    expect(again.notes.join('\n')).toContain(`${digest} already pulled`);
    expect(again.environment.layers).toEqual(built.environment.layers);
  });

  it('builds FROM a pinned digest with the registry gone; a tag it cannot resolve fails or falls back as asked', async () => {
    const pinned = await dockerfile(
      'Dockerfile.pinned',
      `FROM ${registry.host}/team/tool:1@${digest}\nRUN ls /etc\n`,
    );
    const byTag = await dockerfile('Dockerfile.tag', `FROM ${registry.host}/team/tool:1\nRUN ls /etc\n`);
    // make sure the digest is in the store, then take the registry away
    await env.platform.buildFromDockerfile({ file: pinned, name: 'pinned:first', registry: { authFile } });
    await registry.stop();
    const offline = await env.platform.buildFromDockerfile({ file: pinned, name: 'pinned:offline' });
    expect(offline.notes.join('\n')).toContain('already pulled');
    await expect(env.platform.buildFromDockerfile({ file: byTag, name: 'tag:offline' })).rejects.toThrow(
      /cannot be reached from this machine.*--fallback-base/,
    );
    // a digest nobody has is not quietly replaced by anything
    const unknown = await dockerfile(
      'Dockerfile.unknown',
      `FROM ${registry.host}/team/tool@sha256:${'0'.repeat(64)}\n`,
    );
    await expect(env.platform.buildFromDockerfile({ file: unknown, name: 'unknown:x' })).rejects.toThrow(
      /not in the store and not pulled/,
    );
    // only a fallback the build asked for stands in, and the notes say so
    const fallback = await env.platform.buildFromDockerfile({
      file: byTag,
      name: 'tag:fallback',
      fromFallback: 'busybox:latest',
    });
    expect(fallback.notes.join('\n')).toMatch(/not pulled .*built on busybox:latest instead, as asked/);
  });
});
