import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { copyFile, mkdir, readFile, readdir, rename, rm, stat, open } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { buildErofsImage, sha256OfFile, type ErofsBuildOptions, type LayerImage } from '../backends/index.ts';
import { SandgymError, parseAt, writeFileAtomic } from '../common/index.ts';

const DIGEST = /^sha256:[0-9a-f]{64}$/;
const ENV_NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const ENV_VERSION = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** The manifest stored beside each layer image. */
export const layerManifestSchema = z.object({
  digest: z.string().regex(DIGEST),
  mediaType: z.literal('application/vnd.sandgym.layer.v1.erofs'),
  sizeBytes: z.number().int().nonnegative(),
  createdFrom: z.string(),
  createdAt: z.string(),
});
export type LayerManifest = z.infer<typeof layerManifestSchema>;

/** A named, versioned environment: an ordered layer stack (base first) plus its config. */
export const environmentSchema = z.object({
  name: z.string().regex(ENV_NAME),
  version: z.string().regex(ENV_VERSION),
  layers: z.array(z.string().regex(DIGEST)).min(1),
  config: z.object({
    env: z.record(z.string(), z.string()).default({}),
    workdir: z.string().startsWith('/').default('/'),
    user: z.string().default('root'),
  }),
  description: z.string().default(''),
});
export type Environment = z.infer<typeof environmentSchema>;
export type EnvironmentInput = z.input<typeof environmentSchema>;

/** Splits "name:version" (version defaults to "latest") and checks both parts. */
export function parseEnvironmentRef(ref: string): { name: string; version: string } {
  const [name = '', version = 'latest', ...rest] = ref.split(':');
  if (rest.length > 0 || !ENV_NAME.test(name) || !ENV_VERSION.test(version)) {
    throw new SandgymError(
      'invalid_argument',
      `Environment reference "${ref}" must look like name:version, e.g. debian:bookworm`,
    );
  }
  return { name, version };
}

/**
 * The layer store: a folder, local or on a shared filesystem, holding immutable EROFS layers
 * addressed by the sha256 of their bytes, and environment manifests. Every write goes through a
 * temp file and a rename, so concurrent writers of the same layer and crashes are both safe.
 */
export class LayerStore {
  private constructor(readonly root: string) {}

  /** Opens (creating if needed) the store at `root`. */
  static async open(root: string): Promise<LayerStore> {
    await Promise.all(
      ['layers/sha256', 'envs', 'tmp', 'cache'].map((d) => mkdir(join(root, d), { recursive: true })),
    );
    return new LayerStore(root);
  }

  private layerPath(digest: string): string {
    return join(this.root, 'layers/sha256', `${digest.slice('sha256:'.length)}.erofs`);
  }

  /** A scratch folder inside the store (same filesystem, so results rename into place). */
  async scratch(prefix: string): Promise<string> {
    const dir = join(this.root, 'tmp', `${prefix}-${randomBytes(6).toString('hex')}`);
    await mkdir(dir, { recursive: true });
    return dir;
  }

  /** Packs a folder into an EROFS layer and stores it; returns its manifest. */
  async addLayerFromDirectory(
    sourceDir: string,
    createdFrom: string,
    leaveOut: ErofsBuildOptions = {},
  ): Promise<LayerManifest> {
    const temp = join(this.root, 'tmp', `layer-${randomBytes(6).toString('hex')}.erofs`);
    try {
      await buildErofsImage(sourceDir, temp, leaveOut);
      const file = await open(temp, 'r');
      await file.sync();
      await file.close();
      const digest = await sha256OfFile(temp);
      const sizeBytes = (await stat(temp)).size;
      // Same bytes, same name: a concurrent writer's rename over ours is harmless.
      await rename(temp, this.layerPath(digest));
      const manifest: LayerManifest = {
        digest,
        mediaType: 'application/vnd.sandgym.layer.v1.erofs',
        sizeBytes,
        createdFrom,
        createdAt: new Date().toISOString(),
      };
      await writeFileAtomic(
        this.layerPath(digest).replace(/\.erofs$/, '.json'),
        JSON.stringify(manifest, null, 2),
      );
      return manifest;
    } finally {
      await rm(temp, { force: true });
    }
  }

  /** The manifest of a stored layer. */
  async getLayer(digest: string): Promise<LayerManifest> {
    const path = this.layerPath(digest).replace(/\.erofs$/, '.json');
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch {
      throw new SandgymError('not_found', `Layer ${digest} is not in the store at ${this.root}`);
    }
    return parseAt(layerManifestSchema, JSON.parse(text), `layer manifest ${path}`);
  }

  /** Every stored layer. */
  async listLayers(): Promise<LayerManifest[]> {
    const names = await readdir(join(this.root, 'layers/sha256'));
    const digests = names.filter((n) => n.endsWith('.json')).map((n) => `sha256:${n.slice(0, -5)}`);
    return Promise.all(digests.map((d) => this.getLayer(d)));
  }

  /** Records an environment version; its layers must be in the store already. */
  async putEnvironment(input: EnvironmentInput): Promise<Environment> {
    const environment = parseAt(environmentSchema, input, 'environment');
    for (const digest of environment.layers) await this.getLayer(digest);
    const dir = join(this.root, 'envs', environment.name);
    await mkdir(dir, { recursive: true });
    await writeFileAtomic(join(dir, `${environment.version}.json`), JSON.stringify(environment, null, 2));
    return environment;
  }

  /** Forgets an environment (its layers stay until layer gc finds them unused). Idempotent. */
  async removeEnvironment(ref: string): Promise<void> {
    const { name, version } = parseEnvironmentRef(ref);
    await rm(join(this.root, 'envs', name, `${version}.json`), { force: true });
  }

  /** True when the environment version is recorded. */
  hasEnvironment(ref: string): boolean {
    const { name, version } = parseEnvironmentRef(ref);
    return existsSync(join(this.root, 'envs', name, `${version}.json`));
  }

  /** An environment by "name:version". */
  async getEnvironment(ref: string): Promise<Environment> {
    const { name, version } = parseEnvironmentRef(ref);
    const path = join(this.root, 'envs', name, `${version}.json`);
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch {
      const known = (await this.listEnvironments()).map((e) => `${e.name}:${e.version}`);
      throw new SandgymError(
        'not_found',
        `Unknown environment "${ref}"; known: ${known.join(', ') || 'none (run "sandgym setup")'}`,
      );
    }
    return parseAt(environmentSchema, JSON.parse(text), `environment manifest ${path}`);
  }

  /** Every recorded environment version. */
  async listEnvironments(): Promise<Environment[]> {
    const environments: Environment[] = [];
    for (const name of await readdir(join(this.root, 'envs'))) {
      for (const file of await readdir(join(this.root, 'envs', name))) {
        if (!file.endsWith('.json') || file.startsWith('.')) continue;
        environments.push(await this.getEnvironment(`${name}:${file.slice(0, -5)}`));
      }
    }
    return environments.sort((a, b) => `${a.name}:${a.version}`.localeCompare(`${b.name}:${b.version}`));
  }

  /**
   * Removes layers that no environment references and nothing in `inUse` needs, once they are
   * older than `minAgeMs`; also temp files a crashed writer left. The manifest goes first, so a
   * crash midway leaves a file nobody names rather than a name without a file.
   */
  async collectGarbage(options: {
    minAgeMs: number;
    inUse: ReadonlySet<string>;
  }): Promise<{ removed: string[]; freedBytes: number }> {
    const referenced = new Set(options.inUse);
    for (const environment of await this.listEnvironments())
      for (const digest of environment.layers) referenced.add(digest);
    const now = Date.now();
    const removed: string[] = [];
    let freedBytes = 0;
    for (const layer of await this.listLayers()) {
      if (referenced.has(layer.digest) || now - Date.parse(layer.createdAt) < options.minAgeMs) continue;
      const image = this.layerPath(layer.digest);
      await rm(image.replace(/\.erofs$/, '.json'), { force: true });
      for (const file of [image, image.replace(/\.erofs$/, '.tar.gz')]) {
        freedBytes += (await stat(file).catch(() => undefined))?.size ?? 0;
        await rm(file, { force: true });
      }
      removed.push(layer.digest);
    }
    for (const name of await readdir(join(this.root, 'tmp'))) {
      const path = join(this.root, 'tmp', name);
      const info = await stat(path).catch(() => undefined);
      if (info && now - info.mtimeMs >= Math.max(options.minAgeMs, 60 * 60_000))
        await rm(path, { recursive: true, force: true });
    }
    return { removed, freedBytes };
  }

  /** Copies an environment and its layers from another store (a cluster seeding its shared store). */
  async importEnvironment(source: LayerStore, ref: string): Promise<Environment> {
    const environment = await source.getEnvironment(ref);
    for (const digest of environment.layers) {
      if (existsSync(this.layerPath(digest))) continue;
      await this.getLayerFrom(source, digest);
    }
    return this.putEnvironment(environment);
  }

  private async getLayerFrom(source: LayerStore, digest: string): Promise<void> {
    const manifest = await source.getLayer(digest);
    const temp = join(this.root, 'tmp', `import-${randomBytes(6).toString('hex')}.erofs`);
    try {
      await copyFile(source.layerPath(digest), temp);
      if ((await sha256OfFile(temp)) !== digest) {
        throw new SandgymError(
          'failed_precondition',
          `Layer ${digest} in ${source.root} is corrupt: its bytes do not match its digest`,
        );
      }
      await rename(temp, this.layerPath(digest));
    } finally {
      await rm(temp, { force: true });
    }
    await writeFileAtomic(
      this.layerPath(digest).replace(/\.erofs$/, '.json'),
      JSON.stringify(manifest, null, 2),
    );
  }

  /** The layer a build step with this cache key made, if it is still in the store. */
  async cachedStep(key: string): Promise<string | undefined> {
    try {
      const { digest } = JSON.parse(await readFile(join(this.root, 'cache', `${key}.json`), 'utf8')) as {
        digest: string;
      };
      if (typeof digest === 'string' && DIGEST.test(digest) && existsSync(this.layerPath(digest)))
        return digest;
    } catch {
      // not cached, or a damaged entry: build the step again
    }
    return undefined;
  }

  /** Records the layer a build step made, under its cache key. */
  async cacheStep(key: string, digest: string): Promise<void> {
    await writeFileAtomic(join(this.root, 'cache', `${key}.json`), JSON.stringify({ digest }));
  }

  /** The layer images of an environment, base first, as a backend mounts them. */
  async layerImages(environment: Environment): Promise<LayerImage[]> {
    return Promise.all(
      environment.layers.map(async (digest) => {
        const manifest = await this.getLayer(digest);
        return { digest, path: this.layerPath(digest), sizeBytes: manifest.sizeBytes };
      }),
    );
  }
}
