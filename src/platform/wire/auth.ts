import { timingSafeEqual, createHash } from 'node:crypto';
import type { Metadata } from '@grpc/grpc-js';
import { z } from 'zod';
import { MAX_GRANT_RULES, type NetworkGrant } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';
import type { Authenticate, Principal } from './principal.ts';

/** The metadata key a trusted caller (a controller) uses to say which project it acts for. */
export const PROJECT_KEY = 'sandgym-project';

/**
 * The metadata key a controller uses to pass the project's quota to a node, which enforces it
 * with an etcd transaction when the cluster keeps its state in etcd.
 */
export const QUOTA_KEY = 'sandgym-quota';

/**
 * The metadata key a controller uses to pass the network rules the project's grant allows (a JSON
 * array of rules) with the calls that set a sandbox's rules. A call without it comes from a holder
 * of the node token acting as the operator: every rule of the node's rule book.
 */
export const NETWORK_GRANT_KEY = 'sandgym-network';

const networkGrantSchema = z.array(z.string().min(1).max(256)).max(MAX_GRANT_RULES);

/** The network grant a trusted caller passed with a call, if any; anything but a list of rules is refused. */
export function networkGrantOf(metadata: Metadata): NetworkGrant | undefined {
  const value = metadata.get(NETWORK_GRANT_KEY)[0];
  if (value === undefined) return undefined;
  let parsed: unknown;
  try {
    parsed = typeof value === 'string' ? JSON.parse(value) : undefined;
  } catch {
    parsed = undefined;
  }
  const grant = networkGrantSchema.safeParse(parsed);
  if (!grant.success) {
    throw new SandgymError(
      'invalid_argument',
      `${NETWORK_GRANT_KEY} must be a JSON array of at most ${MAX_GRANT_RULES} network rules`,
    );
  }
  return grant.data;
}

/**
 * The metadata key a controller uses to pass a project's store quota, in bytes, with the calls
 * that make layers (PackDiff), when its grant sets one.
 */
export const STORE_QUOTA_KEY = 'sandgym-store-quota';

const PROJECT_NAME = /^[a-z0-9][a-z0-9_-]{0,63}$/;

/** The quota a trusted caller passed with a call, if any; anything but a count is refused. */
export function quotaOf(metadata: Metadata): number | undefined {
  const value = metadata.get(QUOTA_KEY)[0];
  if (value === undefined) return undefined;
  if (typeof value !== 'string' || !/^\d{1,9}$/.test(value)) {
    throw new SandgymError('invalid_argument', `${QUOTA_KEY} must be a whole number of sandboxes`);
  }
  return Number(value);
}

/** The store quota a trusted caller passed with a call, if any; anything but a byte count is refused. */
export function storeQuotaOf(metadata: Metadata): number | undefined {
  const value = metadata.get(STORE_QUOTA_KEY)[0];
  if (value === undefined) return undefined;
  if (typeof value !== 'string' || !/^\d{1,15}$/.test(value)) {
    throw new SandgymError('invalid_argument', `${STORE_QUOTA_KEY} must be a whole number of bytes`);
  }
  return Number(value);
}

/** The least a node token may be: it gives its holder every project's sandboxes on the node. */
const MIN_TOKEN_CHARS = 32;
const MIN_DISTINCT_CHARS = 10;

/**
 * Refuses a token anyone could guess: a node token lets its holder act for any project on the
 * node (controllers name the project per call), so it must be long and random.
 */
export function checkTokenStrength(token: string, what: string): void {
  const distinct = new Set(token).size;
  if (token.length < MIN_TOKEN_CHARS || distinct < MIN_DISTINCT_CHARS || /\s/.test(token)) {
    throw new SandgymError(
      'invalid_argument',
      `${what} is too weak (${token.length} characters, ${distinct} different): use at least ${MIN_TOKEN_CHARS} random characters without spaces, e.g. the output of \`openssl rand -hex 32\``,
    );
  }
}

/** A token's sha256, which tokens are compared by (in constant time, so no timing tells a byte). */
export function tokenDigest(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}

/** The token of an `authorization: Bearer <token>` header, or undefined. */
export function bearerToken(header: unknown): string | undefined {
  if (typeof header !== 'string') return undefined;
  return /^Bearer\s+(\S+)$/i.exec(header)?.[1];
}

function unauthenticated(path: string, why: string): SandgymError {
  return new SandgymError('unauthenticated', `${path}: ${why}; send "authorization: Bearer <token>"`);
}

/**
 * Authenticates calls by bearer token. `tokens` maps each token to its project. With
 * `trustProjectHeader`, a caller holding a valid token may act for the project it names in
 * `sandgym-project` (how controllers call node agents), and one that names none is the node's
 * operator.
 */
export function tokenAuthenticator(
  tokens: Record<string, string>,
  options: { trustProjectHeader?: boolean } = {},
): Authenticate {
  // compare digests in constant time, so a token cannot be guessed byte by byte from timings
  const known = Object.entries(tokens).map(([token, project]) => ({ hash: tokenDigest(token), project }));
  return (metadata, path): Principal => {
    const token = bearerToken(metadata.get('authorization')[0]);
    if (!token) throw unauthenticated(path, 'no token');
    const hash = tokenDigest(token);
    const match = known.find((entry) => timingSafeEqual(entry.hash, hash));
    if (!match) throw unauthenticated(path, 'the token is not valid');
    if (!options.trustProjectHeader) return { project: match.project, isOperator: false };
    const named = metadata.get(PROJECT_KEY)[0];
    // the node token itself, acting for no project: the node's operator
    if (named === undefined) return { project: match.project, isOperator: true };
    if (typeof named !== 'string' || !PROJECT_NAME.test(named)) {
      throw new SandgymError(
        'invalid_argument',
        `${path}: ${PROJECT_KEY} must be a project name (a-z, 0-9, _ and -)`,
      );
    }
    return { project: named, isOperator: false };
  };
}
