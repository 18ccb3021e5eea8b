import { isIP } from 'node:net';

/** One DNS label (RFC 1123, lower case, as Harbor normalises allowed hosts). */
const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

/** Name suffixes that are the node's own or a local network, never a public host (RFC 6761, 6762, 8375). */
const LOCAL_SUFFIXES = ['localhost', 'local', 'localdomain', 'internal', 'home.arpa', 'lan', 'arpa'];

/**
 * Why `host` cannot name a public host a sandbox may be let through to, or undefined when it can.
 * Whoever writes it (a task's author, a tenant) must never reach the node host, its network or a
 * cloud's metadata service through it: an address literal, a wildcard, a name without a dot (the
 * node's search domains resolve it on its own network) and the local suffixes (`localhost`,
 * `metadata.google.internal`) are refused by name; what a name resolves to is checked again when
 * a sandbox's network is set up.
 */
export function publicHostNameProblem(host: string): string | undefined {
  if (host.length === 0) return 'is empty';
  if (isIP(host) !== 0 || host.includes('/') || host.includes(':'))
    return 'is an address: only host names are taken, as an address or a range could name the node or its network';
  if (host.includes('*'))
    return 'is a wildcard, which has no addresses to resolve when the sandbox starts: list each name';
  if (host.length > 253) return 'is longer than a host name can be (253 characters)';
  const labels = host.split('.');
  if (!labels.every((label) => LABEL.test(label)))
    return 'is not a host name (lower-case letters, digits, hyphens and dots)';
  if (labels.length < 2) return "has no dot: the node's search domains would resolve it on its own network";
  if (LOCAL_SUFFIXES.some((suffix) => host === suffix || host.endsWith(`.${suffix}`)))
    return "names the node's own or a local network (a cloud's metadata service, say)";
  return undefined;
}
