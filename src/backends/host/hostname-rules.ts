import { lookup } from 'node:dns/promises';
import { networkInterfaces } from 'node:os';
import { SandgymError, publicHostNameProblem } from '../../common/index.ts';
import { NEVER_REACHED } from './egress-guard.ts';
import { ipv4Number, optionalRule, prefixMask } from './network-rules.ts';

/**
 * `hostname:NAME` rules: a public host by name (Harbor's `allowed_hosts`), resolved to the IPv4
 * addresses DNS gives when a sandbox's network is set up, every port of them. Whoever names the
 * host (a task's author, a tenant) must never open a path to the node or its network with it: the
 * name is checked (publicHostNameProblem), and so is every address it resolves to, here, before
 * any rule is written.
 */
const PREFIX = 'hostname:';

/**
 * Addresses a host name may not bring into a sandbox's rules besides those the guard refuses
 * anyway: the private ranges (the node's own network, its neighbours, a VPC's services).
 */
const PRIVATE: readonly string[] = ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16'];

const REFUSED: readonly { cidr: string; why: string }[] = [
  ...NEVER_REACHED.map((cidr) => ({ cidr, why: refusedWhy(cidr) })),
  ...PRIVATE.map((cidr) => ({ cidr, why: 'a private address (the node’s own network)' })),
];

function refusedWhy(cidr: string): string {
  if (cidr.startsWith('127.')) return 'loopback';
  if (cidr.startsWith('169.254.')) return 'link-local (a cloud’s metadata service)';
  if (cidr.startsWith('100.64.') || cidr.startsWith('198.18.')) return 'a sandbox network';
  return 'an address no sandbox reaches';
}

/** The host a `hostname:` rule names (without a final `?`), or undefined for another rule. */
export function hostnameOfRule(rule: string): string | undefined {
  const { rule: bare } = optionalRule(rule);
  return bare.startsWith(PREFIX) ? bare.slice(PREFIX.length) : undefined;
}

/** Fails on a `hostname:` rule whose name could not be a public host, before anything starts. */
export function checkHostnameRules(rules: readonly string[]): void {
  for (const rule of rules) {
    const host = hostnameOfRule(rule);
    const problem = host === undefined ? undefined : publicHostNameProblem(host);
    if (problem) throw new SandgymError('invalid_argument', `Network rule "${rule}": "${host}" ${problem}`);
  }
}

/** Whether `address` lies in `cidr` (`a.b.c.d/n`). */
function inCidr(address: number, cidr: string): boolean {
  const [base = '', bits = '32'] = cidr.split('/');
  const mask = prefixMask(Number(bits));
  return (address & mask) >>> 0 === (ipv4Number(base) & mask) >>> 0;
}

/** Why a resolved address may not be reached by name, or undefined. */
function addressProblem(address: string, node: NodeLinks): string | undefined {
  const n = ipv4Number(address);
  for (const { cidr, why } of REFUSED) if (inCidr(n, cidr)) return why;
  if (node.addresses.has(address)) return 'an address of the node itself';
  // its router and neighbours: whatever the node's own links reach, public ranges or not
  const link = node.links.find((cidr) => inCidr(n, cidr));
  return link ? `on a network the node is on (${link})` : undefined;
}

/** The node's own IPv4 addresses and the networks its interfaces are on. */
interface NodeLinks {
  addresses: ReadonlySet<string>;
  links: readonly string[];
}

function nodeLinks(): NodeLinks {
  const ipv4 = Object.values(networkInterfaces())
    .flat()
    .flatMap((a) => (a?.family === 'IPv4' ? [a] : []));
  return {
    addresses: new Set(ipv4.map((a) => a.address)),
    links: ipv4.flatMap((a) => (a.cidr ? [a.cidr] : [])),
  };
}

/** How names are resolved (DNS by default; tests give their own). */
export type HostLookup = (host: string) => Promise<string[]>;

const dnsLookup: HostLookup = async (host) =>
  (await lookup(host, { family: 4, all: true })).map((a) => a.address);

/**
 * `rules` with every `hostname:NAME` replaced by a `host:IP` rule per address NAME resolves to.
 * A name that does not resolve fails the set-up (an optional one, `hostname:NAME?`, adds nothing);
 * a name that resolves to loopback, link-local, a private range, a sandbox network, an address
 * of the node itself or one on a network the node is on (its router, its neighbours) is refused, naming the host, the address and why.
 */
export async function resolveHostnameRules(
  rules: readonly string[],
  resolve: HostLookup = dnsLookup,
): Promise<string[]> {
  if (!rules.some((rule) => hostnameOfRule(rule) !== undefined)) return [...rules];
  checkHostnameRules(rules);
  const own = nodeLinks();
  const out: string[] = [];
  for (const rule of rules) {
    const host = hostnameOfRule(rule);
    if (host === undefined) {
      out.push(rule);
      continue;
    }
    let addresses: string[];
    try {
      addresses = await resolve(host);
    } catch (error) {
      if (optionalRule(rule).optional) continue;
      throw new SandgymError(
        'failed_precondition',
        `Network rule "${rule}": ${host} does not resolve from this node (${(error as Error).message})`,
        { cause: error },
      );
    }
    for (const address of addresses) {
      const problem = addressProblem(address, own);
      if (problem)
        throw new SandgymError(
          'permission_denied',
          `Network rule "${rule}": ${host} resolves to ${address}, ${problem}: a sandbox is never let through to it by name; allow a public host`,
        );
      out.push(`host:${address}`);
    }
  }
  return out;
}
