import { lookup } from 'node:dns/promises';
import { readFile } from 'node:fs/promises';
import { isIPv4 } from 'node:net';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';

/** One address set a sandbox may reach: an IPv4 network, and one port of it or all. */
export interface EgressTarget {
  /** `a.b.c.d/n` */
  cidr: string;
  port?: number;
}

/**
 * The node's named rules (`mirror:debian` → its addresses). `host:IP[:PORT]` and
 * `cidr:A.B.C.D/N[:PORT]` name themselves; every other name must be defined here.
 */
export type NetworkRuleBook = Readonly<Record<string, readonly string[]>>;

/** What a rule-book name may be made of. */
export const RULE_NAME = /^[a-z0-9][a-z0-9._:/-]{0,127}$/i;

/**
 * `IP[/N][:PORT]`, the form of an address in a rule definition, as the network it names (host
 * bits cleared, so `10.9.1.1/16` and `10.9.0.0/16` are one set).
 */
export function parseAddress(text: string, where: string): EgressTarget {
  const match = /^(\d{1,3}(?:\.\d{1,3}){3})(?:\/(\d{1,2}))?(?::(\d{1,5}))?$/.exec(text.trim());
  const [, ip, bits = '32', port] = match ?? [];
  const prefix = Number(bits);
  if (
    !ip ||
    !isIPv4(ip) ||
    prefix > 32 ||
    (port !== undefined && (Number(port) < 1 || Number(port) > 65535))
  ) {
    throw new SandgymError(
      'invalid_argument',
      `${where}: "${text}" is not an address; write IP, IP:PORT, IP/N or IP/N:PORT (IPv4)`,
    );
  }
  const network = (ipv4Number(ip) & prefixMask(prefix)) >>> 0;
  return {
    cidr: `${ipv4Text(network)}/${prefix}`,
    ...(port === undefined ? {} : { port: Number(port) }),
  };
}

/** An IPv4 address as an unsigned 32-bit number. */
export function ipv4Number(ip: string): number {
  return ip.split('.').reduce((n, part) => n * 256 + Number(part), 0);
}

function ipv4Text(n: number): string {
  return [24, 16, 8, 0].map((shift) => (n >>> shift) & 255).join('.');
}

/** The netmask of a prefix length, as an unsigned 32-bit number (0 for /0). */
export function prefixMask(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

/** The address text of a rule that names itself (`host:IP[:PORT]`, `cidr:A.B.C.D/N[:PORT]`); else undefined. */
export function selfNamedAddress(rule: string): string | undefined {
  const [kind, ...rest] = rule.split(':');
  return kind === 'host' || kind === 'cidr' ? rest.join(':') : undefined;
}

/** A rule without the `?` that makes it optional, and whether it had one. */
export function optionalRule(asked: string): { rule: string; optional: boolean } {
  const optional = asked.endsWith('?');
  return { rule: optional ? asked.slice(0, -1) : asked, optional };
}

/** Checks a rule book's definitions, so a typo fails when the node starts, not at a task's setup. */
export function checkRuleBook(book: NetworkRuleBook): void {
  for (const [name, addresses] of Object.entries(book)) {
    if (!RULE_NAME.test(name)) {
      throw new SandgymError(
        'invalid_argument',
        `Network rule name "${name}" has characters a rule name cannot`,
      );
    }
    for (const address of addresses) parseAddress(address, `network rule "${name}"`);
  }
}

const ruleBookFile = z.record(z.string(), z.array(z.string()).max(4096));

/**
 * A rule book from a JSON file (`{"mirror:debian": ["10.1.2.3:80", "10.1.2.4:80"]}`), checked;
 * none when `path` is undefined.
 */
export async function readNetworkRules(path: string | undefined): Promise<NetworkRuleBook> {
  if (path === undefined) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(path, 'utf8'));
  } catch (error) {
    throw new SandgymError(
      'invalid_argument',
      `Cannot read the network rules file ${path}: ${(error as Error).message}`,
    );
  }
  const book = parseAt(ruleBookFile, parsed, `network rules file ${path}`);
  checkRuleBook(book);
  return book;
}

/**
 * Rules for reaching a Debian mirror from this host as it is configured now: `mirror:debian`
 * (every IPv4 address the mirror's host name has, on the mirror URL's port) and `dns` (the host's
 * first IPv4 resolver, port 53: apt in a sandbox resolves the name itself).
 */
export async function hostDebianMirrorRules(
  mirror = process.env['SANDGYM_DEBIAN_MIRROR'] ?? 'http://deb.debian.org/debian',
): Promise<NetworkRuleBook> {
  const url = new URL(mirror);
  const addresses = await lookup(url.hostname, { family: 4, all: true });
  const resolver = /^nameserver\s+(\d+\.\d+\.\d+\.\d+)/m.exec(
    await readFile('/etc/resolv.conf', 'utf8'),
  )?.[1];
  if (!resolver)
    throw new SandgymError('failed_precondition', 'No IPv4 nameserver in /etc/resolv.conf for the dns rule');
  const port = url.port || (url.protocol === 'https:' ? '443' : '80');
  return { 'mirror:debian': addresses.map((a) => `${a.address}:${port}`), dns: [`${resolver}:53`] };
}

/**
 * The rule book of a node given none: the host's package mirrors, so Dockerfile builds reach
 * Debian's packages (and npm's registry) as they would on a developer's machine, and nothing
 * else. Sandboxes reach none of it unless their policy names a rule. A mirror that cannot be
 * resolved now is left out rather than failing the node.
 */
export async function defaultRuleBook(env: NodeJS.ProcessEnv = process.env): Promise<NetworkRuleBook> {
  if (env['SANDGYM_NET_RULES']) return readNetworkRules(env['SANDGYM_NET_RULES']);
  // a resolver that does not answer must not hold up the node: mirrors it cannot name go without
  const [debian, npm] = await Promise.all([
    withinDeadline(hostDebianMirrorRules(), MIRROR_LOOKUP_MS),
    withinDeadline(
      lookup('registry.npmjs.org', { family: 4, all: true }).then((addresses) => ({
        'mirror:npm': addresses.map((a) => `${a.address}:443`),
      })),
      MIRROR_LOOKUP_MS,
    ),
  ]);
  return debian ? { ...debian, ...npm } : {};
}

/** How long the default rule book waits for the mirrors' names. */
const MIRROR_LOOKUP_MS = 3000;

/** The promise's value, or undefined when it fails or takes longer than `ms`. */
function withinDeadline<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms);
    timer.unref();
  });
  return Promise.race([promise.catch(() => undefined), late]).finally(() => clearTimeout(timer));
}

/**
 * The address sets `rules` name, in order, duplicates dropped. A name ending in `?` is optional:
 * where the node does not define it, it adds nothing instead of failing (a Harbor task's
 * `allow_internet = true` asks for `internet?`: it may have the internet, and needs none to run).
 */
export function resolveRules(rules: readonly string[], book: NetworkRuleBook): EgressTarget[] {
  const targets = new Map<string, EgressTarget>();
  for (const asked of rules) {
    const { rule, optional } = optionalRule(asked);
    const self = selfNamedAddress(rule);
    const addresses = self === undefined ? book[rule] : [self];
    if (!addresses && optional) continue;
    if (!addresses) {
      const known = Object.keys(book);
      throw new SandgymError(
        'invalid_argument',
        `Network rule "${rule}" is not defined on this node (it knows ${known.length > 0 ? known.join(', ') : 'none'}): define it in the node's rule book (sandgym node --net-rules FILE, or $SANDGYM_NET_RULES), or use host:IP[:PORT] or cidr:A.B.C.D/N[:PORT]`,
      );
    }
    for (const address of addresses) {
      const target = parseAddress(address, `network rule "${rule}"`);
      targets.set(`${target.cidr}:${target.port ?? '*'}`, target);
    }
  }
  return [...targets.values()];
}
