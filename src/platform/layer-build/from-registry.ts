import { createHash } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';
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

/**
 * Pulls an image from its registry with skopeo into the store, as one environment per manifest
 * digest. A pinned digest already in the store needs no network; a tag is asked for its current
 * digest first, and only a digest the store lacks is downloaded. Blobs land in one shared folder
 * by digest, so images that share base layers download them once; skopeo checks every blob
 * against its digest.
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

  const blobs = join(store.root, 'cache', 'oci-blobs');
  await mkdir(blobs, { recursive: true });
  const layout = await store.scratch('pull');
  try {
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
    await rm(layout, { recursive: true, force: true });
  }
}
