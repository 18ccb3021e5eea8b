import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { mkdir, open, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from '../../backends/index.ts';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';
import type { Environment, ProjectStore } from '../store/layer-store.ts';
import { buildLayerFromOci } from './from-oci.ts';
import {
  isLoopbackRegistry,
  pulledEnvironmentName,
  transportReference,
  type ImageReference,
} from './image-reference.ts';

/** How builds reach OCI registries for FROM images the store lacks. */
export interface RegistryOptions {
  /**
   * A docker config (`~/.docker/config.json`) or containers `auth.json` with the registries'
   * credentials. Default: skopeo's own lookup (`$REGISTRY_AUTH_FILE`, then the docker config).
   */
  authFile?: string;
  /** Registries reached over plain HTTP or with unverified TLS; loopback hosts always are. */
  insecureRegistries?: readonly string[];
  /** How long one pull may take; default 10 minutes. */
  timeoutMs?: number;
  /** When the pull, its unpacking included, must have ended (ms since the epoch): a build's deadline. */
  deadlineAt?: number;
}

/** What {@link pullImage} did. */
export interface PulledImage {
  environment: Environment;
  /** The manifest digest the environment holds. */
  digest: string;
  /** True when the store already had this digest and nothing was downloaded. */
  cached: boolean;
}

const DEFAULT_PULL_TIMEOUT_MS = 10 * 60_000;

function skopeoFlags(ref: ImageReference, options: RegistryOptions, direction: 'src' | ''): string[] {
  const prefix = direction ? `--${direction}-` : '--';
  const insecure =
    isLoopbackRegistry(ref.registry) || (options.insecureRegistries ?? []).includes(ref.registry);
  return [
    ...(insecure ? [`${prefix}tls-verify=false`] : []),
    ...(options.authFile ? [`${prefix}authfile`, options.authFile] : []),
  ];
}

/** Why a pull failed, in words that say what to change. */
function pullError(ref: ImageReference, error: unknown): SandgymError {
  const printed = error instanceof Error ? error.message : String(error);
  // skopeo's own words (msg="..."), without the command line runProgram quotes around them
  const said = /msg="((?:[^"\\]|\\.)*)"/.exec(printed)?.[1]?.replace(/\\"/g, '"') ?? printed;
  const hint = /unauthorized|authentication required|denied/i.test(said)
    ? 'the registry wants credentials: log in with a docker config and pass it as the registry auth file'
    : /no such host|connection refused|timeout|network is unreachable|i\/o timeout/i.test(said)
      ? `${ref.registry} cannot be reached from this machine`
      : /manifest unknown|not found|name unknown/i.test(said)
        ? `${ref.registry} has no such image`
        : 'see the registry error above';
  return new SandgymError('not_found', `Cannot pull ${ref.familiar}: ${hint} (${said})`, { cause: error });
}

const indexSchema = z.object({
  manifests: z.array(
    z.object({
      digest: z.string(),
      annotations: z.record(z.string(), z.string()).optional(),
    }),
  ),
});
const manifestSchema = z.object({
  config: z.object({ digest: z.string() }),
  layers: z.array(z.object({ digest: z.string() })),
});
const SHA256 = /^sha256:[0-9a-f]{64}$/;

/** Whether the file at `path` (a regular file, not followed if a symlink) hashes to `digest`. */
async function matches(path: string, digest: string): Promise<boolean> {
  const hash = createHash('sha256');
  const file = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK).catch(
    () => undefined,
  );
  if (!file) return false;
  try {
    if (!(await file.stat()).isFile()) return false;
    for await (const chunk of file.createReadStream({ autoClose: false })) hash.update(chunk as Buffer);
  } finally {
    await file.close();
  }
  return `sha256:${hash.digest('hex')}` === digest;
}

/**
 * The blobs of the image `tag` of an OCI layout (its manifest, config and layers) kept in
 * `blobs` whose bytes do not hash to their digests.
 */
async function mismatchedBlobs(blobs: string, layout: string, tag: string): Promise<string[]> {
  const where = `${layout}/index.json`;
  const index = parseAt(indexSchema, JSON.parse((await readFile(where)).toString('utf8')), where);
  const entry = index.manifests.find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === tag);
  if (!entry || !SHA256.test(entry.digest))
    throw new SandgymError('not_found', `${where} names no image "${tag}"`);
  const pathOf = (digest: string) => join(blobs, 'sha256', digest.slice('sha256:'.length));
  if (!(await matches(pathOf(entry.digest), entry.digest))) return [pathOf(entry.digest)];
  const manifest = parseAt(manifestSchema, JSON.parse(await readFile(pathOf(entry.digest), 'utf8')), where);
  const bad: string[] = [];
  for (const { digest } of [manifest.config, ...manifest.layers]) {
    if (!SHA256.test(digest)) throw new SandgymError('not_found', `${where}: a blob digest is not sha256`);
    if (!(await matches(pathOf(digest), digest))) bad.push(pathOf(digest));
  }
  return bad;
}

/**
 * Pulls an image from its registry with skopeo into the store, as one environment per manifest
 * digest. A pinned digest already in the store needs no network; a tag is asked for its current
 * digest first, and only a digest the store lacks is downloaded. Blobs land in the project's
 * folder by digest, so its images that share base layers download them once; every blob an image
 * uses is checked against its digest before it is used.
 */
export async function pullImage(
  store: ProjectStore,
  ref: ImageReference,
  options: RegistryOptions = {},
): Promise<PulledImage> {
  const name = pulledEnvironmentName(ref);
  // one deadline for the whole pull, download and unpacking alike: a registry that dribbles or a
  // layer that unpacks slowly cannot stall whoever asked past it
  const deadlineAt = Math.min(
    options.deadlineAt ?? Infinity,
    Date.now() + (options.timeoutMs ?? DEFAULT_PULL_TIMEOUT_MS),
  );
  const left = (): number => {
    const ms = deadlineAt - Date.now();
    if (ms <= 0) throw new SandgymError('failed_precondition', `Cannot pull ${ref.familiar}: out of time`);
    return ms;
  };
  let digest = ref.digest;
  if (!digest) {
    const manifest = await runProgram(
      'skopeo',
      ['inspect', '--raw', ...skopeoFlags(ref, options, ''), transportReference(ref)],
      { timeoutMs: left() },
    ).catch((error: unknown) => {
      throw pullError(ref, error);
    });
    digest = `sha256:${createHash('sha256').update(manifest).digest('hex')}`;
  }
  const version = digest.slice('sha256:'.length);
  const existing = `${name}:${version}`;
  if (store.hasEnvironment(existing))
    return { environment: await store.getEnvironment(existing), digest, cached: true };

  // the project's own blob cache: another project's pulls (a private registry's layers among
  // them) are never reused here, and a manifest naming their digests cannot reach them
  const blobs = join(store.root, 'projects', store.project, 'cache', 'oci-blobs');
  await mkdir(blobs, { recursive: true });
  const layout = await store.scratch('pull');
  try {
    // skopeo skips a blob the cache already holds without reading it: each is checked against
    // its digest here, and one that does not match is removed and fetched again
    for (let attempt = 0; ; attempt++) {
      await runProgram(
        'skopeo',
        [
          'copy',
          '--quiet',
          ...skopeoFlags(ref, options, 'src'),
          '--dest-shared-blob-dir',
          blobs,
          transportReference(ref, digest),
          `oci:${layout}:${version}`,
        ],
        { timeoutMs: left() },
      ).catch((error: unknown) => {
        throw pullError(ref, error);
      });
      const bad = await mismatchedBlobs(blobs, layout, version);
      if (bad.length === 0) break;
      for (const path of bad) await rm(path, { force: true });
      if (attempt > 0)
        throw new SandgymError(
          'not_found',
          `Cannot pull ${ref.familiar}: ${bad.length} of its blobs do not match their digests`,
        );
    }
    const { layer, config, image } = await buildLayerFromOci(store, layout, {
      blobDir: blobs,
      tag: version,
      deadlineAt,
    });
    const environment = await store.putEnvironment({
      name,
      version,
      layers: [layer.digest],
      config,
      image,
      description: `pulled ${ref.familiar} (${digest})`,
    });
    return { environment, digest, cached: false };
  } finally {
    await store.removeScratch(layout);
  }
}
