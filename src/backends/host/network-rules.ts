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

const RULE_NAME = /^[a-z0-9][a-z0-9._:/-]{0,127}$/i;

/** `IP[/N][:PORT]`, the form of an address in a rule definition. */
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
  return { cidr: `${ip}/${prefix}`, ...(port === undefined ? {} : { port: Number(port) }) };
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
 * The address sets `rules` name, in order, duplicates dropped. A name ending in `?` is optional:
 * where the node does not define it, it adds nothing instead of failing (a Harbor task's
 * `allow_internet = true` asks for `internet?`: it may have the internet, and needs none to run).
 */
export function resolveRules(rules: readonly string[], book: NetworkRuleBook): EgressTarget[] {
  const targets = new Map<string, EgressTarget>();
  for (const asked of rules) {
    const optional = asked.endsWith('?');
    const rule = optional ? asked.slice(0, -1) : asked;
    const [kind, ...rest] = rule.split(':');
    const self = kind === 'host' || kind === 'cidr' ? [rest.join(':')] : undefined;
    const addresses = self ?? book[rule];
    if (!addresses && optional) continue;
    if (!addresses) {
      const known = Object.keys(book);
      throw new SandgymError(
        'invalid_argument',
        `Network rule "${rule}" is not defined on this node (it knows ${known.length > 0 ? known.join(', ') : 'none'}): define it in the node's network rules (sandgym node --net-rule ${rule}=IP[:PORT],...), or use host:IP[:PORT] or cidr:A.B.C.D/N[:PORT]`,
      );
    }
    for (const address of addresses) {
      const target = parseAddress(address, `network rule "${rule}"`);
      targets.set(`${target.cidr}:${target.port ?? '*'}`, target);
    }
  }
  return [...targets.values()];
}
