import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import {
  copyFile,
  mkdir,
  readFile,
  readdir,
  rename,
  rm,
  stat,
  statfs,
  open,
  utimes,
  writeFile,
} from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { withRootedTree } from '../layer-build/rooted-tree.ts';
import { z } from 'zod';
import { buildErofsImage, sha256OfFile, type LayerImage } from '../../backends/index.ts';
import { SandgymError, parseAt, writeFileAtomic } from '../../common/index.ts';
import { ManifestCache } from './manifest-cache.ts';

const DIGEST = /^sha256:[0-9a-f]{64}$/;
/** A project's name, as tokens map to them (the same rule as the wire's). */
const PROJECT_NAME = /^[a-z0-9][a-z0-9_-]{0,63}$/;

/** After this long without a refresh, a process's pins no longer count: its node is gone. */
export const PIN_STALE_MS = 15 * 60_000;

/** What one process sharing the store needs kept (see {@link LayerStore.writePins}). */
const pinRecordSchema = z.object({
  host: z.string(),
  pid: z.number().int(),
  startTime: z.number(),
  updatedAt: z.number(),
  digests: z.array(z.string().regex(DIGEST)),
});
export type PinRecord = z.infer<typeof pinRecordSchema>;
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

/** What an image says of itself beyond its files and config: kept, not acted on. */
export const imageMetadataSchema = z.object({
  labels: z.record(z.string(), z.string()).default({}),
  cmd: z.array(z.string()).optional(),
  entrypoint: z.array(z.string()).optional(),
  exposedPorts: z.array(z.string()).default([]),
  volumes: z.array(z.string()).default([]),
  healthcheck: z.string().optional(),
  stopSignal: z.string().optional(),
  shell: z.array(z.string()).optional(),
  onbuild: z.array(z.string()).optional(),
});
export type ImageMetadata = z.infer<typeof imageMetadataSchema>;

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
  /** From a Dockerfile or an image: labels, CMD, ENTRYPOINT, exposed ports, volumes and the like. */
  image: imageMetadataSchema.optional(),
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
 * Removes a folder with everything below it, folder by folder through descriptors, so that no
 * path grows past PATH_MAX however deep the tree is; nothing there is fine.
 */
async function removeTree(path: string): Promise<void> {
  await withRootedTree(dirname(path), `store folder ${dirname(path)}`, (tree) => tree.remove(basename(path)));
}

/** Beside a scratch folder of the store's `tmp`: its owner is still using it. */
const LIVE_MARKER = '.live';
/** How often a process touches its scratch folders' markers; well inside the hour they may idle. */
const SCRATCH_HEARTBEAT_MS = 5 * 60_000;

/**
 * The layer store: a folder, local or on a shared filesystem, holding immutable EROFS layers
 * addressed by the sha256 of their bytes, and environment manifests. Every write goes through a
 * temp file and a rename, so concurrent writers of the same layer and crashes are both safe.
 */
export class LayerStore {
  /** Layer manifests by digest: a digest names fixed bytes, so a manifest read once holds. */
  private readonly layerManifests = new Map<string, LayerManifest>();
  /** Per project, the last of its store admissions in this process (see {@link admitting}). */
  private readonly admissions = new Map<string, Promise<void>>();
  readonly environmentManifests = new ManifestCache((json, path) =>
    parseAt(environmentSchema, json, `environment manifest ${path}`),
  );

  /** This process's scratch folders whose markers it keeps fresh (see {@link scratch}). */
  private readonly liveScratch = new Set<string>();
  private heartbeat: NodeJS.Timeout | undefined;

  private constructor(readonly root: string) {}

  /** Opens (creating if needed) the store at `root`. */
  static async open(root: string): Promise<LayerStore> {
    await Promise.all(
      ['layers/sha256', 'envs', 'tmp', 'cache', 'owners', 'pins', 'projects'].map((d) =>
        mkdir(join(root, d), { recursive: true }),
      ),
    );
    return new LayerStore(root);
  }

  /** Where a layer's image is; also what a project view reads. */
  layerPath(digest: string): string {
    return join(this.root, 'layers/sha256', `${digest.slice('sha256:'.length)}.erofs`);
  }

  /**
   * A scratch folder inside the store (same filesystem, so results rename into place). Beside it
   * a marker (`NAME.live`) says it is in use: this process touches it every few minutes while
   * the folder exists, and collection ages the folder by its marker alone. The folder's own times
   * say nothing (a build sets every folder's times of an image to 0, and a long step leaves its
   * root untouched), so a build in progress is never taken for a crashed writer's leftovers.
   */
  async scratch(prefix: string): Promise<string> {
    const dir = join(this.root, 'tmp', `${prefix}-${randomBytes(6).toString('hex')}`);
    await writeFile(`${dir}${LIVE_MARKER}`, '');
    await mkdir(dir, { recursive: true });
    this.liveScratch.add(dir);
    this.heartbeat ??= setInterval(() => void this.touchLiveScratch(), SCRATCH_HEARTBEAT_MS).unref();
    return dir;
  }

  /**
   * Removes a scratch folder and its marker, however deep its tree (a name the kernel refused
   * as too long leaves paths no path-based removal can reach); nothing there is fine.
   */
  async removeScratch(dir: string): Promise<void> {
    await removeTree(dir);
    this.liveScratch.delete(dir);
    await rm(`${dir}${LIVE_MARKER}`, { force: true });
  }

  /** Touches the markers of this process's scratch folders; forgets (and unmarks) those gone. */
  private async touchLiveScratch(): Promise<void> {
    const now = new Date();
    for (const dir of this.liveScratch) {
      if (existsSync(dir)) await utimes(`${dir}${LIVE_MARKER}`, now, now).catch(() => undefined);
      else {
        this.liveScratch.delete(dir);
        await rm(`${dir}${LIVE_MARKER}`, { force: true });
      }
    }
  }

  /** Packs a folder into an EROFS layer and stores it; returns its manifest. */
  async addLayerFromDirectory(sourceDir: string, createdFrom: string): Promise<LayerManifest> {
    const temp = join(this.root, 'tmp', `layer-${randomBytes(6).toString('hex')}.erofs`);
    try {
      await buildErofsImage(sourceDir, temp);
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
    const environment = await this.environmentManifests.read(
      join(this.root, 'envs', name, `${version}.json`),
    );
    if (environment) return environment;
    const known = (await this.listEnvironments()).map((e) => `${e.name}:${e.version}`);
    throw new SandgymError(
      'not_found',
      `Unknown environment "${ref}"; known: ${known.join(', ') || 'none (run "sandgym setup")'}`,
    );
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
   * Removes layers that no environment of any project references and nothing pinned needs (a
   * live sandbox anywhere the store is shared, a layer made moments ago for a grader or a build
   * step), once they are older than `minAgeMs`; also temp files a crashed writer left. With an
   * `owner`, only that project's layers are candidates, and a layer another project made too
   * loses only the owner's claim: a project's collection never takes what another one made.
   * Without one (the node's admin) every unreferenced, unpinned layer is. The manifest goes
   * first, so a crash midway leaves a file nobody names rather than a name without a file.
   */
  async collectGarbage(options: {
    minAgeMs: number;
    pinned: ReadonlySet<string>;
    owner?: string;
    /** Also remove scratch folders older than an hour: another project's may still be building. */
    sweepScratch?: boolean;
  }): Promise<{ removed: string[]; freedBytes: number }> {
    const referenced = new Set(options.pinned);
    for (const environment of await this.allEnvironments())
      for (const digest of environment.layers) referenced.add(digest);
    const now = Date.now();
    const removed: string[] = [];
    let freedBytes = 0;
    for (const layer of await this.listLayers()) {
      if (referenced.has(layer.digest) || now - Date.parse(layer.createdAt) < options.minAgeMs) continue;
      const hex = layer.digest.slice('sha256:'.length);
      const owners = await this.ownersOf(hex);
      if (options.owner !== undefined) {
        if (!owners.includes(options.owner)) continue;
        await rm(join(this.root, 'owners', options.owner, hex), { force: true });
        if (owners.length > 1) continue; // another project made it too: theirs to collect
      }
      freedBytes += await this.removeLayer(layer.digest, owners);
      removed.push(layer.digest);
    }
    const names = options.sweepScratch === false ? [] : await readdir(join(this.root, 'tmp'));
    for (const name of names) {
      // a scratch folder is aged by its marker (see scratch()), never by its own times
      const path = join(this.root, 'tmp', name);
      const marked = names.includes(`${name}${LIVE_MARKER}`);
      const info = await stat(marked ? `${path}${LIVE_MARKER}` : path).catch(() => undefined);
      if (!info || now - info.mtimeMs < Math.max(options.minAgeMs, 60 * 60_000)) continue;
      await removeTree(path);
      if (marked) await rm(`${path}${LIVE_MARKER}`, { force: true });
    }
    return { removed, freedBytes };
  }

  /**
   * Deletes a layer and the marks of the projects that made it; the bytes it freed. The manifest
   * goes first, so a crash midway leaves a file nobody names rather than a name without a file.
   */
  private async removeLayer(digest: string, owners: readonly string[]): Promise<number> {
    const hex = digest.slice('sha256:'.length);
    const image = this.layerPath(digest);
    this.layerManifests.delete(digest);
    await rm(image.replace(/\.erofs$/, '.json'), { force: true });
    let freedBytes = 0;
    for (const file of [image, image.replace(/\.erofs$/, '.tar.gz')]) {
      freedBytes += (await stat(file).catch(() => undefined))?.size ?? 0;
      await rm(file, { force: true });
    }
    for (const owner of owners) await rm(join(this.root, 'owners', owner, hex), { force: true });
    return freedBytes;
  }

  /**
   * The bytes `project` holds in the store: the layers it made (a layer another project made too
   * counts for each) and its environments' manifests. What its store quota is measured against.
   */
  async bytesOf(project: string): Promise<number> {
    let bytes = 0;
    for (const hex of await readdir(join(this.root, 'owners', project)).catch(() => [] as string[])) {
      const manifest = await this.cachedManifest(`sha256:${hex}`).catch(() => undefined);
      bytes += manifest?.sizeBytes ?? 0;
    }
    const envs = join(this.root, 'projects', project, 'envs');
    for (const name of await readdir(envs).catch(() => [] as string[])) {
      for (const file of await readdir(join(envs, name)).catch(() => [] as string[]))
        bytes += (await stat(join(envs, name, file)).catch(() => undefined))?.size ?? 0;
    }
    return bytes;
  }

  /**
   * Runs `admit` alone among this process's admissions for `project`, so that two of its layers
   * made at once cannot both fit in the room one of them leaves (see ProjectStore's quota).
   */
  async admitting<T>(project: string, admit: () => Promise<T>): Promise<T> {
    const before = this.admissions.get(project) ?? Promise.resolve();
    const mine = before.then(admit, admit);
    const settled = mine.then(
      () => undefined,
      () => undefined,
    );
    this.admissions.set(project, settled);
    try {
      return await mine;
    } finally {
      if (this.admissions.get(project) === settled) this.admissions.delete(project);
    }
  }

  /**
   * Forgets a layer `project` just made but may not keep: deleted unless another project made it
   * too, or an environment of any project references it.
   */
  async discardNew(project: string, digest: string): Promise<void> {
    const hex = digest.slice('sha256:'.length);
    const owners = (await this.ownersOf(hex)).filter((owner) => owner !== project);
    if (owners.length > 0) return;
    for (const environment of await this.allEnvironments()) if (environment.layers.includes(digest)) return;
    await this.removeLayer(digest, [project]);
  }

  /** A layer's manifest, read once: a digest names fixed bytes. */
  private async cachedManifest(digest: string): Promise<LayerManifest> {
    let manifest = this.layerManifests.get(digest);
    if (!manifest) {
      manifest = await this.getLayer(digest);
      this.layerManifests.set(digest, manifest);
    }
    return manifest;
  }

  /** The projects that made a layer (hex digest). */
  private async ownersOf(hex: string): Promise<string[]> {
    const projects = await readdir(join(this.root, 'owners')).catch(() => [] as string[]);
    return projects.filter((project) => existsSync(join(this.root, 'owners', project, hex)));
  }

  /** Whether `project` made the layer (see {@link markOwner}). */
  async isOwner(project: string, digest: string): Promise<boolean> {
    return (await this.ownersOf(digest.slice('sha256:'.length))).includes(project);
  }

  /** Records that `project` made a layer, so that its layer gc may collect it. */
  async markOwner(project: string, digest: string): Promise<void> {
    const dir = join(this.root, 'owners', project);
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, digest.slice('sha256:'.length)), '');
  }

  /** The projects with environments of their own in this store. */
  async projects(): Promise<string[]> {
    return (await readdir(join(this.root, 'projects')).catch(() => [] as string[])).filter((name) =>
      PROJECT_NAME.test(name),
    );
  }

  /** Every environment of every project and the shared ones: what layer gc must keep. */
  private async allEnvironments(): Promise<Environment[]> {
    const all = await this.listEnvironments();
    for (const project of await this.projects())
      all.push(...(await this.forProject(project).ownEnvironments()));
    return all;
  }

  /** The store as `project` sees it: its own environments first, then the shared ones. */
  forProject(
    project: string,
    onLayerAdded?: (digest: string) => Promise<void>,
    quota?: StoreQuota,
  ): ProjectStore {
    return new ProjectStore(this, project, onLayerAdded, quota);
  }

  /**
   * Records which layers a process needs kept (its sandboxes' and those it just made), for the
   * layer gc of every process and node that shares this store. `name` is the process's own.
   */
  async writePins(name: string, record: PinRecord): Promise<void> {
    await writeFileAtomic(join(this.root, 'pins', `${name}.json`), JSON.stringify(record), { sync: false });
  }

  async removePins(name: string): Promise<void> {
    await rm(join(this.root, 'pins', `${name}.json`), { force: true });
  }

  /**
   * What every process sharing the store has pinned. A record not refreshed for {@link PIN_STALE_MS}
   * (its node is gone) no longer counts, nor does one of a dead process on this host.
   */
  async livePins(isAlive: (record: PinRecord) => Promise<boolean>): Promise<Set<string>> {
    const pinned = new Set<string>();
    for (const file of await readdir(join(this.root, 'pins')).catch(() => [] as string[])) {
      if (!file.endsWith('.json')) continue;
      const path = join(this.root, 'pins', file);
      const record = pinRecordSchema.safeParse(
        await readFile(path, 'utf8').then(
          (text) => JSON.parse(text) as unknown,
          () => undefined,
        ),
      );
      if (
        !record.success ||
        Date.now() - record.data.updatedAt > PIN_STALE_MS ||
        !(await isAlive(record.data))
      ) {
        continue;
      }
      for (const digest of record.data.digests) pinned.add(digest);
    }
    return pinned;
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
  layerImages(environment: Environment): Promise<LayerImage[]> {
    return this.imagesOf(environment.layers);
  }

  /** The images of layers given by digest, in order. */
  async imagesOf(digests: readonly string[]): Promise<LayerImage[]> {
    return Promise.all(
      digests.map(async (digest) => {
        const manifest = await this.cachedManifest(digest);
        return { digest, path: this.layerPath(digest), sizeBytes: manifest.sizeBytes };
      }),
    );
  }
}

/** What a project may hold in the store (see {@link LayerStore.bytesOf}). */
export interface StoreQuota {
  maxBytes: number;
  /** Collects what the project made that nothing needs any more: called before a refusal. */
  makeRoom: () => Promise<void>;
}

/** What the store's filesystem keeps free whatever an archive asks (other builds, the node's own files). */
const UNPACK_RESERVE_BYTES = 2 * 2 ** 30;

function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

/**
 * The layer store as one project sees it. Environments are the project's own, under
 * `projects/<project>/envs`, over the shared ones (`sandgym setup`'s bases, an admin's builds):
 * a project reads its own first, and writes only its own, so no project can read, list, boot or
 * overwrite another's environment by name. Layers are shared by digest (a digest names bytes the
 * asker already has), but each records the projects that made it, whose layer gc alone may
 * collect it; the step cache of Dockerfile builds is the project's own.
 */
export class ProjectStore {
  constructor(
    /** The whole store, every project's. */
    readonly layers: LayerStore,
    readonly project: string,
    /** Told of each layer the project makes, so that its process can pin it while it is fresh. */
    private readonly onLayerAdded?: (digest: string) => Promise<void>,
    /** The most the project may hold in the store; unbounded without. */
    private readonly quota?: StoreQuota,
  ) {
    if (!PROJECT_NAME.test(project)) {
      throw new SandgymError(
        'invalid_argument',
        `Project "${project}" must be a-z, 0-9, _ and -, at most 64`,
      );
    }
  }

  /**
   * Runs `keep`, which makes the project hold `bytes` more, if its quota has room for them, after
   * collecting what it made that nothing needs if it has not; else refuses, retryably (removing
   * environments, or its layers' ageing past their hold, makes room).
   */
  private async withinQuota(bytes: number, keep: () => Promise<void>): Promise<void> {
    const quota = this.quota;
    if (!quota) return keep();
    await this.layers.admitting(this.project, async () => {
      let used = await this.layers.bytesOf(this.project);
      if (used + bytes > quota.maxBytes) {
        await quota.makeRoom();
        used = await this.layers.bytesOf(this.project);
      }
      if (used + bytes > quota.maxBytes) {
        throw new SandgymError(
          'resource_exhausted',
          `Project ${this.project} holds ${mib(used)} of its ${mib(quota.maxBytes)} store quota${bytes > 1 ? `, and this needs ${mib(bytes)} more` : ''}: remove environments it no longer needs (a run's snapshots go with the run), or raise its quota (maxStoreBytes in the controller's grants file, the node's --max-store-mib)`,
          // larger than the whole quota, it never fits: what made it (a sandbox's changes) is at
          // fault, and no retry helps; else the project's other layers may make room
          { retryable: bytes <= quota.maxBytes },
        );
      }
      await keep();
    });
  }

  get root(): string {
    return this.layers.root;
  }

  private envPath(name: string, version: string): string {
    return join(this.root, 'projects', this.project, 'envs', name, `${version}.json`);
  }

  /**
   * Packs a folder into a layer the project made, within its store quota: a full project is
   * refused before the folder is packed, and a layer that would take it past its quota is not kept.
   */
  async addLayerFromDirectory(sourceDir: string, createdFrom: string): Promise<LayerManifest> {
    await this.withinQuota(1, () => Promise.resolve());
    const manifest = await this.layers.addLayerFromDirectory(sourceDir, createdFrom);
    const { digest, sizeBytes } = manifest;
    const owned = await this.layers.isOwner(this.project, digest);
    await this.withinQuota(owned ? 0 : sizeBytes, () => this.layers.markOwner(this.project, digest)).catch(
      async (error: unknown) => {
        await this.layers.discardNew(this.project, digest);
        throw error;
      },
    );
    await this.onLayerAdded?.(digest);
    return manifest;
  }

  /** Records an environment version of the project, within its store quota; its layers must be in the store already. */
  async putEnvironment(input: EnvironmentInput): Promise<Environment> {
    const environment = parseAt(environmentSchema, input, 'environment');
    for (const digest of environment.layers) await this.getLayer(digest);
    const path = this.envPath(environment.name, environment.version);
    const text = JSON.stringify(environment, null, 2);
    await this.withinQuota(Buffer.byteLength(text), async () => {
      await mkdir(join(path, '..'), { recursive: true });
      await writeFileAtomic(path, text);
    });
    return environment;
  }

  /** Forgets one of the project's environments. Idempotent. */
  async removeEnvironment(ref: string): Promise<void> {
    const { name, version } = parseEnvironmentRef(ref);
    await rm(this.envPath(name, version), { force: true });
  }

  /** True when the project has the environment, or a shared one of that name does. */
  hasEnvironment(ref: string): boolean {
    const { name, version } = parseEnvironmentRef(ref);
    return existsSync(this.envPath(name, version)) || this.layers.hasEnvironment(ref);
  }

  /** The project's environment of that name, else the shared one. */
  async getEnvironment(ref: string): Promise<Environment> {
    const { name, version } = parseEnvironmentRef(ref);
    const own = await this.layers.environmentManifests.read(this.envPath(name, version));
    if (own) return own;
    if (this.layers.hasEnvironment(ref)) return this.layers.getEnvironment(ref);
    const known = (await this.listEnvironments()).map((e) => `${e.name}:${e.version}`);
    throw new SandgymError(
      'not_found',
      `Unknown environment "${ref}"; known: ${known.join(', ') || 'none (run "sandgym setup")'}`,
    );
  }

  /** The project's own environments, without the shared ones. */
  async ownEnvironments(): Promise<Environment[]> {
    const environments: Environment[] = [];
    const dir = join(this.root, 'projects', this.project, 'envs');
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      for (const file of await readdir(join(dir, name))) {
        if (!file.endsWith('.json') || file.startsWith('.')) continue;
        const path = join(dir, name, file);
        environments.push(
          parseAt(
            environmentSchema,
            JSON.parse(await readFile(path, 'utf8')),
            `environment manifest ${path}`,
          ),
        );
      }
    }
    return environments;
  }

  /** What the project sees: its own environments, and the shared ones it has none of the same name of. */
  async listEnvironments(): Promise<Environment[]> {
    const own = await this.ownEnvironments();
    const mine = new Set(own.map((e) => `${e.name}:${e.version}`));
    const shared = (await this.layers.listEnvironments()).filter((e) => !mine.has(`${e.name}:${e.version}`));
    return [...own, ...shared].sort((a, b) =>
      `${a.name}:${a.version}`.localeCompare(`${b.name}:${b.version}`),
    );
  }

  getLayer(digest: string): Promise<LayerManifest> {
    return this.layers.getLayer(digest);
  }

  /**
   * Checks that the project may stack a layer by its digest: one it made (a grader's diff, a
   * build step, a checkpoint) or one of an environment it can boot, its own or a shared one
   * (`sandgym setup`'s bases). Digests leak through environments, logs and reports, so any other
   * is `not_found`, worded as for a digest never stored: it must open no other project's files.
   */
  async requireLayer(digest: string): Promise<void> {
    if (existsSync(join(this.root, 'owners', this.project, digest.slice('sha256:'.length)))) return;
    for (const environment of await this.listEnvironments()) if (environment.layers.includes(digest)) return;
    throw new SandgymError(
      'not_found',
      `No layer ${digest} for project ${this.project}: stack layers the project made (packDiff, builds) or its environments hold`,
    );
  }

  /** The layers the project made. */
  async listLayers(): Promise<LayerManifest[]> {
    const mine = await readdir(join(this.root, 'owners', this.project)).catch(() => [] as string[]);
    return Promise.all(mine.map((hex) => this.getLayer(`sha256:${hex}`)));
  }

  layerImages(environment: Environment): Promise<LayerImage[]> {
    return this.layers.layerImages(environment);
  }

  scratch(prefix: string): Promise<string> {
    return this.layers.scratch(prefix);
  }

  removeScratch(dir: string): Promise<void> {
    return this.layers.removeScratch(dir);
  }

  /**
   * The most an archive unpacked for this project may write into scratch space: its store quota
   * (the layer it makes must fit there anyway), and no more than the store's filesystem has free,
   * less a reserve, so that no archive can fill the node's disk.
   */
  async unpackRoomBytes(): Promise<number> {
    const fs = await statfs(this.root);
    const free = Math.max(0, fs.bavail * fs.bsize - UNPACK_RESERVE_BYTES);
    return Math.min(free, this.quota?.maxBytes ?? Infinity);
  }

  /** The layer a build step of this project with this cache key made, if it is still there. */
  cachedStep(key: string): Promise<string | undefined> {
    return this.layers.cachedStep(`${this.project}/${key}`);
  }

  async cacheStep(key: string, digest: string): Promise<void> {
    await mkdir(join(this.root, 'cache', this.project), { recursive: true });
    await this.layers.cacheStep(`${this.project}/${key}`, digest);
  }

  /** Collects the project's own layers that nothing needs (see {@link LayerStore.collectGarbage}). */
  collectGarbage(options: {
    minAgeMs: number;
    pinned: ReadonlySet<string>;
  }): Promise<{ removed: string[]; freedBytes: number }> {
    return this.layers.collectGarbage({ ...options, owner: this.project });
  }
}
