import { SandgymError } from '../../common/index.ts';
import {
  RULE_NAME,
  ipv4Number,
  optionalRule,
  parseAddress,
  prefixMask,
  selfNamedAddress,
  type EgressTarget,
} from './network-rules.ts';

/**
 * The network rules the operator lets a project use (the `network` of its grant): rule-book
 * names (`mirror:debian`, `dns`), and `host:`/`cidr:` address sets inside which the project may
 * name any host, sub-range or port of its own. Empty: loopback only.
 */
export type NetworkGrant = readonly string[];

/** The most rules a grant lists: it travels in each create's call metadata. */
export const MAX_GRANT_RULES = 64;

/** Checks a grant's rules when the controller starts, so a typo fails there and not at a create. */
export function checkNetworkGrant(grant: NetworkGrant, where: string): void {
  if (grant.length > MAX_GRANT_RULES) {
    throw new SandgymError(
      'invalid_argument',
      `${where} grants ${grant.length} network rules; at most ${MAX_GRANT_RULES}: grant a cidr: that covers several`,
    );
  }
  for (const rule of grant) {
    const self = selfNamedAddress(rule);
    if (self !== undefined) parseAddress(self, `${where}, network rule "${rule}"`);
    else if (!RULE_NAME.test(rule)) {
      throw new SandgymError(
        'invalid_argument',
        `${where}: "${rule}" is not a network rule; grant a rule-book name, host:IP[:PORT] or cidr:A.B.C.D/N[:PORT]`,
      );
    }
  }
}

/** Whether every address and port of `inner` is in `outer`. */
function covers(outer: EgressTarget, inner: EgressTarget): boolean {
  const [outerBase = '', outerBits = '32'] = outer.cidr.split('/');
  const [innerBase = '', innerBits = '32'] = inner.cidr.split('/');
  const prefix = Number(outerBits);
  return (
    Number(innerBits) >= prefix &&
    (ipv4Number(innerBase) & prefixMask(prefix)) >>> 0 === ipv4Number(outerBase) &&
    (outer.port === undefined || outer.port === inner.port)
  );
}

/**
 * The rules of `asked` that `grant` lets `who` use, in order: a rule-book name only if the grant
 * names it, a `host:` or `cidr:` rule only if it lies inside a `host:` or `cidr:` the grant names
 * (on its port, when that names one). An optional rule (`name?`) outside the grant is left out, as
 * one the node does not define is; any other is refused. What the rules may then reach is still
 * cut by the node's guard (see egress-guard.ts), whatever the grant says.
 */
export function grantedRules(asked: readonly string[], grant: NetworkGrant, who: string): string[] {
  const names = new Set<string>();
  const sets: EgressTarget[] = [];
  for (const rule of grant) {
    const self = selfNamedAddress(rule);
    if (self === undefined) names.add(rule);
    else sets.push(parseAddress(self, `the network grant of ${who}`));
  }
  return asked.filter((text) => {
    const { rule, optional } = optionalRule(text);
    const self = selfNamedAddress(rule);
    const granted =
      self === undefined
        ? names.has(rule)
        : sets.some((set) => covers(set, parseAddress(self, `network rule "${rule}"`)));
    if (granted || optional) return granted;
    throw new SandgymError(
      'permission_denied',
      `Network rule "${rule}" is not granted to ${who} (${grant.length > 0 ? `it may use ${grant.join(', ')}, and host:/cidr: rules inside its host:/cidr: ones` : 'it has loopback only'}): ask the operator to add it to the project's network in the controller's --grants file`,
    );
  });
}
