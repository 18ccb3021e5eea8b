import { stat } from 'node:fs/promises';
import { resolve } from 'node:path';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';
import type { Environment, ImageMetadata, LayerManifest, ProjectStore } from '../store/layer-store.ts';
import { RootedTree } from './rooted-tree.ts';
import { extractTar, normaliseFolderTimes, openTar, storeBudget, tarStream } from './tar-extract.ts';

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

/** One file of an image: the tree it is read from (the archive's, or the shared blobs) and its path there. */
interface ImageFile {
  tree: RootedTree;
  path: string;
}

/** The image's layers (in order) and its config, however the archive lays them out. */
interface ImageParts {
  layers: ImageFile[];
  config: ImageFile;
}

/** Manifests, indexes and configs are small; a larger one is not an image we can use. */
const MAX_JSON_BYTES = 64 * 2 ** 20;

/** Where an OCI layout keeps a blob: its own `blobs/`, or a folder shared between layouts. */
function blob(layout: RootedTree, digest: string, archive: string, blobs?: RootedTree): ImageFile {
  const [algorithm, hex] = digest.split(':');
  if (algorithm !== 'sha256' || !/^[0-9a-f]{64}$/.test(hex ?? '')) {
    throw new SandgymError('invalid_argument', `${archive}: "${digest}" is not a sha256 digest`);
  }
  return blobs ? { tree: blobs, path: `sha256/${hex}` } : { tree: layout, path: `blobs/sha256/${hex}` };
}

/**
 * A JSON file of the image, read beneath its tree: a symlink in the archive (to a host file, or
 * to another image's blob in the store) resolves inside the archive, never outside it.
 */
async function readJson({ tree, path }: ImageFile, archive: string): Promise<unknown> {
  const bytes = await tree.readFile(path, MAX_JSON_BYTES);
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (error) {
    throw new SandgymError('invalid_argument', `${archive}: ${path} is not valid JSON`, { cause: error });
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
async function imageParts(
  layout: RootedTree,
  archive: string,
  options: OciReadOptions,
  blobs?: RootedTree,
): Promise<ImageParts> {
  if (await layout.realPath('manifest.json')) {
    const [image] = parseAt(
      dockerManifestSchema,
      await readJson({ tree: layout, path: 'manifest.json' }, archive),
      `${archive} manifest.json`,
    );
    return {
      layers: image!.Layers.map((path) => ({ tree: layout, path })),
      config: { tree: layout, path: image!.Config },
    };
  }
  if (await layout.realPath('index.json')) {
    const index = parseAt(
      ociIndexSchema,
      await readJson({ tree: layout, path: 'index.json' }, archive),
      `${archive} index.json`,
    );
    const chosen = options.tag
      ? index.manifests.find((m) => m.annotations?.[REF_NAME] === options.tag)
      : index.manifests[0];
    if (!chosen)
      throw new SandgymError('not_found', `${archive}: the layout has no image named "${options.tag}"`);
    const manifest = parseAt(
      ociManifestSchema,
      await readJson(blob(layout, chosen.digest, archive, blobs), archive),
      `${archive} image manifest`,
    );
    return {
      layers: manifest.layers.map((l) => blob(layout, l.digest, archive, blobs)),
      config: blob(layout, manifest.config.digest, archive, blobs),
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
  /** When unpacking must have ended (ms since the epoch): a build's deadline. */
  deadlineAt?: number;
}

/**
 * The most layers an image may have: overlayfs stacks at most 128 (Docker refuses more), and each
 * one is a whole archive to unpack.
 */
export const MAX_IMAGE_LAYERS = 128;

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
  const opened: RootedTree[] = [];
  const openTree = async (dir: string, label: string): Promise<RootedTree> => {
    const opening = await RootedTree.open(dir, label);
    opened.push(opening);
    return opening;
  };
  try {
    const isFolder = (await stat(path)).isDirectory();
    const layout = await openTree(isFolder ? path : unpacked, path);
    if (!isFolder)
      await extractTar(
        await openTar(path),
        path,
        layout,
        'layer',
        await storeBudget(store, options.deadlineAt),
      );
    const blobs = options.blobDir ? await openTree(options.blobDir, `${path} blobs`) : undefined;
    const parts = await imageParts(layout, path, options, blobs);
    if (parts.layers.length > MAX_IMAGE_LAYERS)
      throw new SandgymError(
        'invalid_argument',
        `${path}: the image has ${parts.layers.length} layers; at most ${MAX_IMAGE_LAYERS} are unpacked`,
      );
    const output = await openTree(tree, path);
    // all the layers together are held to one budget: the same blob named a hundred times, or a
    // hundred small bombs, cost no more than one image may
    const budget = await storeBudget(store, options.deadlineAt);
    for (const [i, layer] of parts.layers.entries()) {
      // a layer applied twice in a row changes nothing (its whiteouts and opaque folders remove
      // only what it does not write itself): Docker's empty layers repeat so
      const previous = parts.layers[i - 1];
      if (previous && previous.tree === layer.tree && previous.path === layer.path) continue;
      const label = `${path} layer ${layer.path}`;
      const into = await output.subtree('', label);
      try {
        await extractTar(
          await tarStream(await layer.tree.openResolved(layer.path)),
          label,
          into,
          'apply',
          budget,
        );
      } finally {
        await into.close();
      }
    }
    const image = parseAt(imageConfigSchema, await readJson(parts.config, path), `${path} image config`);
    const env: Record<string, string> = {};
    for (const pair of image.config?.Env ?? []) {
      const eq = pair.indexOf('=');
      if (eq > 0) env[pair.slice(0, eq)] = pair.slice(eq + 1);
    }
    await normaliseFolderTimes(output);
    const layer = await store.addLayerFromDirectory(tree, `oci ${path}`);
    return {
      layer,
      config: { env, workdir: image.config?.WorkingDir || '/', user: image.config?.User || 'root' },
      image: imageMetadata(image.config),
    };
  } finally {
    for (const opening of opened) await opening.close();
    await store.removeScratch(unpacked);
    await store.removeScratch(tree);
  }
}
