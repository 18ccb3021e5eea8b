import { randomBytes } from 'node:crypto';
import { SandgymError } from './errors.ts';

/** Node ids are short lowercase names, so sandbox ids stay valid cgroup, path and runtime names. */
const NODE_ID = /^[a-z0-9]{1,32}$/;
const SANDBOX_ID = /^sg-([a-z0-9]{1,32})-([a-z0-9]{12})$/;
const ENV_ID = /^env-([a-z0-9]{1,32})-([a-z0-9]{12})$/;
const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

/** A new sandbox id that names its owning node, so any replica can route a call for it. */
export function newSandboxId(nodeId: string): string {
  return nodeScopedId('sg', nodeId);
}

/** `<prefix>-<node>-<12 random chars of a-z0-9>`: an id that names the node that holds it. */
export function nodeScopedId(prefix: string, nodeId: string): string {
  if (!NODE_ID.test(nodeId)) {
    throw new SandgymError(
      'invalid_argument',
      `Node id "${nodeId}" must be 1-32 lowercase letters or digits`,
    );
  }
  const bytes = randomBytes(12);
  let suffix = '';
  for (const byte of bytes) suffix += ALPHABET[byte % ALPHABET.length];
  return `${prefix}-${nodeId}-${suffix}`;
}

/** True for a well-formed sandbox id. */
export function isSandboxId(id: string): boolean {
  return SANDBOX_ID.test(id);
}

/** The node that owns a sandbox id, or a typed error that names the malformed id. */
export function nodeOfSandboxId(id: string): string {
  return nodeNamedBy(SANDBOX_ID, id, 'a sandbox id (expected sg-<node>-<12 chars>)');
}

/** The node that serves an env id (the Envs service), or a typed error that names the malformed id. */
export function nodeOfEnvId(id: string): string {
  return nodeNamedBy(ENV_ID, id, 'an env id (expected env-<node>-<12 chars>)');
}

function nodeNamedBy(pattern: RegExp, id: string, what: string): string {
  const match = pattern.exec(id);
  if (!match?.[1]) throw new SandgymError('invalid_argument', `"${id}" is not ${what}`);
  return match[1];
}
