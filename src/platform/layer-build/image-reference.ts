import { createHash } from 'node:crypto';
import { SandgymError } from '../../common/index.ts';

/** Docker Hub, where a reference without a registry host points. */
const DOCKER_HUB = 'docker.io';

/** An image reference as FROM and `docker pull` take it, taken apart. */
export interface ImageReference {
  /** Registry host, with its port if any: `docker.io`, `127.0.0.1:5000`. */
  registry: string;
  /** Repository path in the registry: `library/debian`, `team/tool`. */
  repository: string;
  /** The tag; `latest` when neither tag nor digest is given. */
  tag?: string;
  /** A pinned manifest digest, `sha256:<64 hex>`. */
  digest?: string;
  /** How Docker would print it short: `debian:bookworm` for `docker.io/library/debian:bookworm`. */
  familiar: string;
}

const COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

/**
 * Parses `[host[:port]/]path[:tag][@sha256:digest]` by Docker's rules: the first component is a
 * registry host when it has a dot or a port or is `localhost`; Docker Hub's official images live
 * under `library/`.
 */
export function parseImageReference(text: string): ImageReference {
  const bad = (why: string): SandgymError =>
    new SandgymError('invalid_argument', `"${text}" is not an image reference: ${why}`);
  const [nameAndTag = '', digest, extra] = text.split('@');
  if (extra !== undefined) throw bad('more than one "@"');
  if (digest !== undefined && !DIGEST.test(digest)) throw bad('the digest must be sha256:<64 hex digits>');
  const slash = nameAndTag.indexOf('/');
  const first = slash < 0 ? '' : nameAndTag.slice(0, slash);
  const hasHost = slash >= 0 && (first.includes('.') || first.includes(':') || first === 'localhost');
  const registry = hasHost ? first : DOCKER_HUB;
  const rest = hasHost ? nameAndTag.slice(slash + 1) : nameAndTag;
  const colon = rest.lastIndexOf(':');
  const path = colon > rest.lastIndexOf('/') && colon >= 0 ? rest.slice(0, colon) : rest;
  const tag = path === rest ? undefined : rest.slice(colon + 1);
  if (tag !== undefined && !TAG.test(tag)) throw bad(`the tag "${tag}" has characters a tag cannot`);
  if (!path.split('/').every((c) => COMPONENT.test(c)))
    throw bad('repository names are lower-case letters, digits and . _ - separated by /');
  const repository = registry === DOCKER_HUB && !path.includes('/') ? `library/${path}` : path;
  const effectiveTag = tag ?? (digest ? undefined : 'latest');
  const shortName =
    registry === DOCKER_HUB ? repository.replace(/^library\//, '') : `${registry}/${repository}`;
  return {
    registry,
    repository,
    ...(effectiveTag ? { tag: effectiveTag } : {}),
    ...(digest ? { digest } : {}),
    familiar: `${shortName}${effectiveTag ? `:${effectiveTag}` : ''}${digest ? `@${digest}` : ''}`,
  };
}

/** The reference as skopeo's docker transport takes it: by digest when pinned (tag dropped). */
export function transportReference(ref: ImageReference, digest = ref.digest): string {
  return `docker://${ref.registry}/${ref.repository}${digest ? `@${digest}` : `:${ref.tag ?? 'latest'}`}`;
}

/** Loopback registries speak plain HTTP, as Docker assumes for them. */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry.replace(/:\d+$/, '').replace(/^\[|\]$/g, '');
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * The store name of an image pulled from a registry: readable, within the store's 64 characters;
 * its version is the manifest digest, so a pinned FROM finds it without asking the registry.
 */
export function pulledEnvironmentName(ref: ImageReference): string {
  const slug = `${ref.registry}/${ref.repository}`.toLowerCase().replace(/[^a-z0-9._-]+/g, '-');
  if (slug.length <= 64) return slug;
  const hash = createHash('sha256').update(slug).digest('hex').slice(0, 12);
  return `${slug.slice(0, 51)}-${hash}`;
}
