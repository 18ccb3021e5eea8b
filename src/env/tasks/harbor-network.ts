import { z } from 'zod';
import { publicHostNameProblem } from '../../common/index.ts';
import { PUBLIC_NETWORK, type NetworkPolicy } from './task.ts';

/** Harbor's network modes. */
export const networkModeSchema = z.enum(['public', 'no-network', 'allowlist']);
type NetworkMode = z.infer<typeof networkModeSchema>;

/**
 * `allowed_hosts`: public host names, normalised as Harbor does (lower case, no final dot). The
 * task's author writes them: see publicHostNameProblem for what is refused and why.
 */
export const allowedHostsSchema = z
  .array(z.string().transform((host) => host.trim().toLowerCase().replace(/\.+$/, '')))
  .superRefine((hosts, ctx) => {
    hosts.forEach((host, i) => {
      const why = publicHostNameProblem(host);
      if (why) ctx.addIssue({ code: 'custom', path: [i], message: `"${host}" ${why}` });
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
