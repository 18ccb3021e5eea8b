import { readFile, rm, stat } from 'node:fs/promises';
import { join, resolve, sep } from 'node:path';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';
import type { Environment, ImageMetadata, LayerManifest, ProjectStore } from '../store/layer-store.ts';
import { extractTar, normaliseFolderTimes, openTar } from './tar-extract.ts';

const dockerManifestSchema = z
  .array(z.object({ Config: z.string(), Layers: z.array(z.string()).min(1) }))
  .min(1);
const ociIndexSchema = z.object({
  manifests: z
    .array(
      z.object({
        digest: z.string(),
        annotations: z.record(z.string(), z.string()).nullish(),
      }),
    )
    .min(1),
});
/** The annotation an OCI layout's index names each image by (skopeo's `oci:DIR:NAME`). */
const REF_NAME = 'org.opencontainers.image.ref.name';
const ociManifestSchema = z.object({
  config: z.object({ digest: z.string() }),
  layers: z.array(z.object({ digest: z.string(), mediaType: z.string() })).min(1),
});
const imageConfigSchema = z.object({
  config: z
    .object({
      Env: z.array(z.string()).nullish(),
      WorkingDir: z.string().nullish(),
      User: z.string().nullish(),
      Cmd: z.array(z.string()).nullish(),
      Entrypoint: z.array(z.string()).nullish(),
      Labels: z.record(z.string(), z.string()).nullish(),
      ExposedPorts: z.record(z.string(), z.unknown()).nullish(),
      Volumes: z.record(z.string(), z.unknown()).nullish(),
      StopSignal: z.string().nullish(),
    })
    .nullish(),
});

/** The image's layers (in order) and its config, however the archive lays them out. */
interface ImageParts {
  layers: string[];
  config: string;
}

function within(root: string, rel: string, archive: string): string {
  const path = resolve(root, rel);
  if (!path.startsWith(root + sep))
    throw new SandgymError('invalid_argument', `${archive}: "${rel}" points outside the image`);
  return path;
}

/** Where an OCI layout keeps its blobs: its own `blobs/`, or a folder shared between layouts. */
function blob(root: string, digest: string, archive: string, blobDir?: string): string {
  const [algorithm, hex] = digest.split(':');
  if (algorithm !== 'sha256' || !/^[0-9a-f]{64}$/.test(hex ?? '')) {
    throw new SandgymError('invalid_argument', `${archive}: "${digest}" is not a sha256 digest`);
  }
  return blobDir ? join(blobDir, 'sha256', hex!) : within(root, `blobs/sha256/${hex}`, archive);
}

async function readJson(path: string, archive: string): Promise<unknown> {
  try {
    return JSON.parse(await readFile(path, 'utf8'));
  } catch (error) {
    throw new SandgymError(
      'invalid_argument',
      `${archive}: cannot read ${path.slice(path.lastIndexOf(sep) + 1)}`,
      { cause: error },
    );
  }
}

function imageMetadata(config: z.infer<typeof imageConfigSchema>['config']): ImageMetadata {
  return {
    labels: { ...config?.Labels },
    exposedPorts: Object.keys(config?.ExposedPorts ?? {}),
    volumes: Object.keys(config?.Volumes ?? {}),
    ...(config?.Cmd ? { cmd: config.Cmd } : {}),
    ...(config?.Entrypoint ? { entrypoint: config.Entrypoint } : {}),
    ...(config?.StopSignal ? { stopSignal: config.StopSignal } : {}),
  };
}

/** docker save output has manifest.json; an OCI layout has index.json and blobs/. */
async function imageParts(root: string, archive: string, options: OciReadOptions): Promise<ImageParts> {
  if (await stat(join(root, 'manifest.json')).catch(() => undefined)) {
    const [image] = parseAt(
      dockerManifestSchema,
      await readJson(join(root, 'manifest.json'), archive),
      `${archive} manifest.json`,
    );
    return {
      layers: image!.Layers.map((l) => within(root, l, archive)),
      config: within(root, image!.Config, archive),
    };
  }
  if (await stat(join(root, 'index.json')).catch(() => undefined)) {
    const index = parseAt(
      ociIndexSchema,
      await readJson(join(root, 'index.json'), archive),
      `${archive} index.json`,
    );
    const chosen = options.tag
      ? index.manifests.find((m) => m.annotations?.[REF_NAME] === options.tag)
      : index.manifests[0];
    if (!chosen)
      throw new SandgymError('not_found', `${archive}: the layout has no image named "${options.tag}"`);
    const manifest = parseAt(
      ociManifestSchema,
      await readJson(blob(root, chosen.digest, archive, options.blobDir), archive),
      `${archive} image manifest`,
    );
    return {
      layers: manifest.layers.map((l) => blob(root, l.digest, archive, options.blobDir)),
      config: blob(root, manifest.config.digest, archive, options.blobDir),
    };
  }
  throw new SandgymError(
    'invalid_argument',
    `${archive} is neither docker save output (manifest.json) nor an OCI layout (index.json)`,
  );
}

/** What {@link buildLayerFromOci} made. */
export interface OciBuildResult {
  layer: LayerManifest;
  config: Environment['config'];
  /** What the image config says of itself beyond env, workdir and user. */
  image: ImageMetadata;
}

/** Which image of an OCI layout to read, and where its blobs are. */
export interface OciReadOptions {
  /** The image's name in the layout's index; default its first image. */
  tag?: string;
  /** Blobs kept outside the layout (skopeo's `--dest-shared-blob-dir`). */
  blobDir?: string;
}

/**
 * One layer from an OCI image archive (docker save output, or an OCI layout folder or tar).
 * The image's layers are applied in order, whiteouts carried out, into a single EROFS layer:
 * one mount per sandbox starts faster than one per image layer, and the tree is the same.
 */
export async function buildLayerFromOci(
  store: ProjectStore,
  archive: string,
  options: OciReadOptions = {},
): Promise<OciBuildResult> {
  const path = resolve(archive);
  const unpacked = await store.scratch('oci');
  const tree = await store.scratch('oci-tree');
  try {
    const root = (await stat(path)).isDirectory() ? path : unpacked;
    if (root === unpacked) await extractTar(await openTar(path), path, unpacked, 'layer');
    const parts = await imageParts(root, path, options);
    for (const layer of parts.layers)
      await extractTar(await openTar(layer), `${path} layer ${layer.slice(root.length + 1)}`, tree, 'apply');
    const image = parseAt(imageConfigSchema, await readJson(parts.config, path), `${path} image config`);
    const env: Record<string, string> = {};
    for (const pair of image.config?.Env ?? []) {
      const eq = pair.indexOf('=');
      if (eq > 0) env[pair.slice(0, eq)] = pair.slice(eq + 1);
    }
    await normaliseFolderTimes(tree);
    const layer = await store.addLayerFromDirectory(tree, `oci ${path}`);
    return {
      layer,
      config: { env, workdir: image.config?.WorkingDir || '/', user: image.config?.User || 'root' },
      image: imageMetadata(image.config),
    };
  } finally {
    await rm(unpacked, { recursive: true, force: true });
    await rm(tree, { recursive: true, force: true });
  }
}
