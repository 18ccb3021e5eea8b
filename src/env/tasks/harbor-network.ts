import { isIP } from 'node:net';
import { z } from 'zod';
import { PUBLIC_NETWORK, type NetworkPolicy } from './task.ts';

/** Harbor's network modes. */
export const networkModeSchema = z.enum(['public', 'no-network', 'allowlist']);
type NetworkMode = z.infer<typeof networkModeSchema>;

/** One DNS label, as Harbor allows it. */
const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

/** Name suffixes that are the node's own network, never a public host (RFC 6761, 6762, 8375). */
const LOCAL_SUFFIXES = ['localhost', 'local', 'localdomain', 'internal', 'home.arpa', 'lan', 'arpa'];

/**
 * Why an allowed host is refused before anything resolves it, or undefined when it is a public
 * host name. The task's author controls it, and a sandbox must never reach the node host, its
 * network or a cloud's metadata service through it; what the name resolves to is checked again
 * when the sandbox's network is set up (see hostname-rules.ts).
 */
function refusal(host: string): string | undefined {
  if (isIP(host) !== 0 || host.includes('/') || host.includes(':'))
    return 'sandgym takes host names only: an address or a range could name the node or its network';
  if (host.startsWith('*.') || host.includes('*'))
    return 'a wildcard cannot be resolved to addresses when the sandbox starts: list each name';
  const labels = host.split('.');
  if (!labels.every((label) => LABEL.test(label)))
    return 'is not a host name (letters, digits, hyphens and dots)';
  if (labels.length < 2)
    return "a name without a dot resolves through the node's search domains, on its own network";
  if (LOCAL_SUFFIXES.some((suffix) => host === suffix || host.endsWith(`.${suffix}`)))
    return "names the node's own or a local network (a cloud's metadata service, say)";
  return undefined;
}

/** `allowed_hosts`: public host names, normalised as Harbor does (lower case, no final dot). */
export const allowedHostsSchema = z
  .array(z.string().transform((host) => host.trim().toLowerCase().replace(/\.+$/, '')))
  .superRefine((hosts, ctx) => {
    hosts.forEach((host, i) => {
      const why = host ? refusal(host) : 'must not be empty';
      if (why) ctx.addIssue({ code: 'custom', path: [i], message: `"${host}": ${why}` });
    });
  });

/** The network fields of `[environment]`, `[agent]` or `[verifier]`. */
interface NetworkFields {
  network_mode?: NetworkMode | undefined;
  allowed_hosts?: string[] | undefined;
}

/** A stage's mode and hosts, resolved. */
interface StagePolicy {
  mode: NetworkMode;
  hosts: string[];
}

/** `allowed_hosts` only goes with `allowlist`, as Harbor's model says; else the field's message. */
export function allowedHostsMisuse(fields: NetworkFields, defaultMode?: NetworkMode): string | undefined {
  const mode = fields.network_mode ?? defaultMode;
  return fields.allowed_hosts !== undefined && mode !== 'allowlist'
    ? `allowed_hosts is only valid with network_mode = "allowlist" (here ${mode ? `"${mode}"` : 'unset'})`
    : undefined;
}

/**
 * The rules of a stage's policy: `public` is the node's internet and mirrors where it has them,
 * `no-network` loopback only, `allowlist` each allowed host by name (resolved when the sandbox's
 * network is set up) and the node's resolver, so the sandbox can look the names up itself.
 */
function rulesOf({ mode, hosts }: StagePolicy): string[] {
  if (mode === 'no-network') return [];
  if (mode === 'public') return [...PUBLIC_NETWORK];
  return [...hosts.map((host) => `hostname:${host}`), 'dns?'];
}

/**
 * A Harbor task's network as Harbor gives it: the environment's mode (`network_mode`, or the
 * older `allow_internet` where neither network_mode nor allowed_hosts is given; public when
 * nothing says), which `[agent]` and `[verifier]` may each override with their own mode and hosts.
 */
export function harborNetwork(toml: {
  environment: NetworkFields & { allow_internet?: boolean | undefined };
  agent: NetworkFields;
  verifier: NetworkFields;
}): NetworkPolicy {
  const { environment } = toml;
  const legacy =
    environment.network_mode === undefined && environment.allowed_hosts === undefined
      ? environment.allow_internet
      : undefined;
  const base: StagePolicy = {
    mode: environment.network_mode ?? (legacy === false ? 'no-network' : 'public'),
    hosts: environment.allowed_hosts ?? [],
  };
  const stage = (fields: NetworkFields): StagePolicy =>
    fields.network_mode ? { mode: fields.network_mode, hosts: fields.allowed_hosts ?? [] } : base;
  return { setup: rulesOf(base), agent: rulesOf(stage(toml.agent)), verify: rulesOf(stage(toml.verifier)) };
}
