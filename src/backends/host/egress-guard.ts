import { isIPv4 } from 'node:net';
import { SandgymError } from '../../common/index.ts';
import { parseAddress } from './network-rules.ts';

/**
 * Destinations no sandbox reaches whatever its rules name. The node network's guard refuses them
 * (and every address of the node host itself, by the kernel's own routing table, and IPv6)
 * before any allow rule is looked at.
 */
export const NEVER_REACHED: readonly string[] = [
  '0.0.0.0/8', // "this host"
  '127.0.0.0/8', // loopback
  '169.254.0.0/16', // link-local: cloud metadata services (169.254.169.254)
  '100.64.0.0/10', // every node's sandbox subnet (and 100.100.100.200, a cloud's metadata)
  '198.18.0.0/15', // sandbox group networks (a task's services)
  '224.0.0.0/4', // multicast
  '240.0.0.0/4', // reserved, and the limited broadcast 255.255.255.255
];

/**
 * The cluster's control plane as a node knows it: networks no rule reaches on any port, and
 * ports no rule reaches on any address (controllers, node agents, etcd, metrics elsewhere).
 */
export interface ControlPlane {
  /** `a.b.c.d/n` */
  hosts: string[];
  ports: number[];
}

/**
 * A control plane from its endpoints: `IP[/N][:PORT]` keeps sandboxes off that network on every
 * port and off PORT on every address; `:PORT` off the port everywhere; a URL
 * (`http://10.0.0.5:2379`, an etcd endpoint) off its port everywhere, and off its host when the
 * host is an address (a host name is not resolved: it may move).
 */
export function controlPlaneOf(endpoints: readonly string[]): ControlPlane {
  const plane: ControlPlane = { hosts: [], ports: [] };
  for (const endpoint of endpoints) {
    if (endpoint.includes('://')) {
      const url = parseUrl(endpoint);
      const host = url.hostname;
      if (url.port) plane.ports.push(Number(url.port));
      if (isIPv4(host)) plane.hosts.push(`${host}/32`);
      continue;
    }
    const port = /^:(\d{1,5})$/.exec(endpoint)?.[1];
    if (port !== undefined) {
      plane.ports.push(checkedPort(Number(port), endpoint));
      continue;
    }
    const target = parseAddress(endpoint, 'control plane endpoint');
    plane.hosts.push(target.cidr);
    if (target.port !== undefined) plane.ports.push(target.port);
  }
  return plane;
}

/** Both planes' networks and ports, each once. */
export function mergeControlPlanes(a: ControlPlane, b: ControlPlane): ControlPlane {
  return {
    hosts: [...new Set([...a.hosts, ...b.hosts])],
    ports: [...new Set([...a.ports, ...b.ports])],
  };
}

function parseUrl(endpoint: string): URL {
  try {
    return new URL(endpoint);
  } catch {
    throw new SandgymError('invalid_argument', `Control plane endpoint "${endpoint}" is not a URL`);
  }
}

function checkedPort(port: number, endpoint: string): number {
  if (port < 1 || port > 65535) {
    throw new SandgymError(
      'invalid_argument',
      `Control plane endpoint "${endpoint}": a port is 1 to 65535; write IP[/N][:PORT] or :PORT`,
    );
  }
  return port;
}
