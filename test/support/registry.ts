import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { tarArchive, type TestTarEntry } from './tar-writer.ts';
import { freePort } from '../../benchmarks/loopback.ts';

const run = promisify(execFile);

/** A user the test registry knows: `tester` with this password. */
export const REGISTRY_USER = { name: 'tester', password: 'registry-test-password-0123456789' };
/** bcrypt of {@link REGISTRY_USER}'s password, as the registry's htpasswd file wants it. */
const REGISTRY_USER_BCRYPT = '$2b$10$fLzqbkS/LKp614duyjTLgOMAI0ah9GAuwzJcUS00lTJ988cND21.K';

/** Debian's docker-registry on loopback with basic auth, its storage in `dir`. */
export class TestRegistry implements AsyncDisposable {
  private constructor(
    readonly host: string,
    private readonly child: ChildProcess,
  ) {}

  static async start(dir: string): Promise<TestRegistry> {
    await mkdir(dir, { recursive: true });
    const port = await freePort();
    await writeFile(join(dir, 'htpasswd'), `${REGISTRY_USER.name}:${REGISTRY_USER_BCRYPT}\n`);
    await writeFile(
      join(dir, 'config.yml'),
      [
        'version: 0.1',
        'log: { level: warn }',
        `storage: { filesystem: { rootdirectory: ${join(dir, 'data')} } }`,
        `http: { addr: "127.0.0.1:${port}" }`,
        `auth: { htpasswd: { realm: sandgym-test, path: ${join(dir, 'htpasswd')} } }`,
        '',
      ].join('\n'),
    );
    const child = spawn('docker-registry', ['serve', join(dir, 'config.yml')], { stdio: 'ignore' });
    const registry = new TestRegistry(`127.0.0.1:${port}`, child);
    const deadline = Date.now() + 20_000;
    for (;;) {
      // 401 without credentials: the registry is up and asks for them
      const status = await fetch(`http://${registry.host}/v2/`).then(
        (r) => r.status,
        () => 0,
      );
      if (status === 401) return registry;
      if (Date.now() > deadline || child.exitCode !== null) {
        await registry.stop();
        throw new Error(`docker-registry did not start on ${registry.host}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** A docker config file with this registry's credentials. */
  async authFile(path: string): Promise<string> {
    const auth = Buffer.from(`${REGISTRY_USER.name}:${REGISTRY_USER.password}`).toString('base64');
    await writeFile(path, JSON.stringify({ auths: { [this.host]: { auth } } }), { mode: 0o600 });
    return path;
  }

  /**
   * Pushes an OCI layout's image as `repository:tag`, the way a user's `docker push` would;
   * returns the digest the registry serves it under.
   */
  async push(layout: string, repository: string, tag: string): Promise<string> {
    const digestFile = join(layout, 'pushed-digest');
    await run('skopeo', [
      'copy',
      '--quiet',
      '--digestfile',
      digestFile,
      '--dest-tls-verify=false',
      '--dest-creds',
      `${REGISTRY_USER.name}:${REGISTRY_USER.password}`,
      `oci:${layout}`,
      `docker://${this.host}/${repository}:${tag}`,
    ]);
    return (await readFile(digestFile, 'utf8')).trim();
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGTERM');
    await exited;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}

/** An image to write as an OCI layout: its layers (bottom first) and image config. */
export interface TestImage {
  layers: TestTarEntry[][];
  config: Record<string, unknown>;
}

/** Writes an OCI image layout at `dir`. */
export async function writeOciLayout(dir: string, image: TestImage): Promise<void> {
  const sha = (data: Buffer | string): string => createHash('sha256').update(data).digest('hex');
  await mkdir(join(dir, 'blobs/sha256'), { recursive: true });
  const layers = image.layers.map((entries) => tarArchive(entries));
  const config = JSON.stringify({
    architecture: 'amd64',
    os: 'linux',
    rootfs: { type: 'layers', diff_ids: layers.map((l) => `sha256:${sha(l)}`) },
    config: image.config,
  });
  const manifest = JSON.stringify({
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    config: {
      mediaType: 'application/vnd.oci.image.config.v1+json',
      digest: `sha256:${sha(config)}`,
      size: Buffer.byteLength(config),
    },
    layers: layers.map((l) => ({
      mediaType: 'application/vnd.oci.image.layer.v1.tar',
      digest: `sha256:${sha(l)}`,
      size: l.length,
    })),
  });
  for (const blob of [config, manifest, ...layers])
    await writeFile(join(dir, 'blobs/sha256', sha(blob)), blob);
  await writeFile(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  await writeFile(
    join(dir, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [
        {
          mediaType: 'application/vnd.oci.image.manifest.v1+json',
          digest: `sha256:${sha(manifest)}`,
          size: Buffer.byteLength(manifest),
        },
      ],
    }),
  );
}
