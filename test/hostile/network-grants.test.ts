import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createSocket, type Socket } from 'node:dgram';
import { rm } from 'node:fs/promises';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitUntil } from '../../benchmarks/loopback.ts';
import { silentLogger } from '../../src/common/index.ts';
import { Controller, Platform, type RemotePlatform, type Sandbox } from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT, createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { startPrometheus } from '../support/prometheus.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';
import { attack } from './summary.ts';

/** The test's stand-in for a host beyond this one: a namespace it makes (see startUpstream). */
const UPSTREAM_INDEX = 28;
const UPSTREAM = `10.250.${UPSTREAM_INDEX}.2`;
/** The host's own end of the upstream's link: an address of the node host like any other. */
const UPSTREAM_LINK = `10.250.${UPSTREAM_INDEX}.1`;
/** Answered by the upstream too: a metadata-like link-local service, and another node's sandbox. */
const LINK_LOCAL = `169.254.${UPSTREAM_INDEX}.2`;
const OTHER_NODE_SANDBOX = `100.127.${UPSTREAM_INDEX}.2`;
/** A secondary address of the node host, on the host's end of the upstream's link. */
const SECONDARY = `10.251.${UPSTREAM_INDEX}.1`;
/**
 * Unreachable routes under the test's own: should its namespace or link vanish during a run, what
 * the sandboxes try stays on this machine instead of following the default route out.
 */
const FALLBACK_ROUTES = [UPSTREAM, LINK_LOCAL, OTHER_NODE_SANDBOX, SECONDARY].map((a) =>
  a.replace(/\.\d+$/, '.0/24'),
);
/** A controller's port elsewhere, which the node is told of (`--control-plane :7443`). */
const CONTROLLER_PORT = 7443;

const TOKENS = {
  alpha: 'alpha-net-token-3c5e7a9b1d2f4680',
  beta: 'beta-net-token-8f6d4b2a0c1e3957',
  narrow: 'narrow-net-token-5a7c9e1b3d0f2468',
  plain: 'plain-net-token-2e4c6a8b0d1f3579',
};
const METRICS_TOKEN = 'metrics-scrape-token-7b9d1f3a5c2e4068';
const GRANTS = {
  // the most a grant can give: every address
  [TOKENS.alpha]: { project: 'alpha', maxSandboxes: 20, network: ['cidr:0.0.0.0/0'] },
  [TOKENS.beta]: { project: 'beta', maxSandboxes: 20, network: ['cidr:0.0.0.0/0'] },
  // one rule-book name, and one port of a /30
  [TOKENS.narrow]: {
    project: 'narrow',
    maxSandboxes: 20,
    network: ['mirror:test', `cidr:10.250.${UPSTREAM_INDEX}.0/30:8080`],
  },
  // no network in the grant: loopback only
  [TOKENS.plain]: { project: 'plain', maxSandboxes: 20 },
};

/** The upstream's UDP port that, once a datagram arrives, sends its sender a datagram every 100 ms. */
const PUSH_PORT = 9100;
const PUSHER = `
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', ${PUSH_PORT}))
s.setblocking(False)
peers, n, end = set(), 0, time.time() + 300
while time.time() < end:
    try:
        while True:
            peers.add(s.recvfrom(64)[1])
    except BlockingIOError:
        pass
    for peer in peers:
        n += 1
        s.sendto(b'push %d' % n, peer)
    time.sleep(0.1)
`;
/**
 * In the sandbox: says hello to the pusher from port 5555 every half second (unless told to keep
 * quiet), and counts in /tmp/pushed the datagrams that come back.
 */
const LISTENER = `
import socket, sys, threading, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', 5555))
def hello():
    while True:
        try:
            s.sendto(b'hello', (sys.argv[2], ${PUSH_PORT}))
        except OSError:
            pass
        time.sleep(0.5)
if sys.argv[1] == 'hello':
    threading.Thread(target=hello, daemon=True).start()
n = 0
while True:
    s.recv(64)
    n += 1
    open('/tmp/pushed', 'w').write(str(n))
`;

/** A TCP or UDP destination an attack tries from inside a sandbox. */
interface Target {
  /** `ttl1`: a datagram that expires at the first router (with a door). */
  kind: 'tcp' | 'udp' | 'ttl1';
  host: string;
  port: number;
}

interface Outcome {
  target: string;
  /** `connected:<what the server sent>`, `sent` (UDP) or `failed:<why>`. */
  outcome: string;
}

/**
 * Tries each target once from inside the sandbox (Debian's python3), as root there; with an
 * interface named after the targets, every packet goes out of it whatever the routes say (IP_UNICAST_IF needs no privilege; the kernel then takes any
 * address as on the link, so it asks the link who has it). TTL=1 datagrams report the ICMP error
 * a router answered with.
 */
const PROBE = `
import json, socket, struct, sys, time
IP_UNICAST_IF, IP_RECVERR = 50, 11
door = sys.argv[2] if len(sys.argv) > 2 else ''
out = []
for t in json.loads(sys.argv[1]):
    kind, host, port = t['kind'], t['host'], t['port']
    try:
        family = socket.AF_INET6 if kind == 'tcp' and ':' in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_DGRAM if kind != 'tcp' else socket.SOCK_STREAM)
        if door:
            s.setsockopt(socket.IPPROTO_IP, IP_UNICAST_IF, struct.pack('!I', socket.if_nametoindex(door)))
        if kind == 'tcp':
            s.settimeout(3)
            s.connect((host, port))
            data = b''
            try:
                data = s.recv(200)
            except Exception:
                pass
            outcome = 'connected:' + data.decode(errors='replace').strip()
        else:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            if kind == 'ttl1':
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 1)
                s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
            s.sendto(b'probe', (host, port))
            outcome = 'sent'
            if kind == 'ttl1':
                time.sleep(1)
                try:
                    _, cmsgs, _, _ = s.recvmsg(64, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                    for _, _, err in cmsgs:
                        # struct sock_extended_err, then the offender's sockaddr_in
                        icmp_type, code = err[5], err[6]
                        offender = socket.inet_ntoa(err[20:24])
                        outcome = 'icmp ' + str(icmp_type) + '/' + str(code) + ' from ' + offender
                except BlockingIOError:
                    pass
        s.close()
    except Exception as e:
        outcome = 'failed:' + type(e).__name__ + ' ' + str(e)
    out.append({'target': kind + ' ' + host + ' ' + str(port), 'outcome': outcome})
print(json.dumps(out))
`;

/** The node host's first global IPv4 address on an interface of its own (not the test's or sandgym's). */
function hostAddress(): string {
  const out = execFileSync('ip', ['-4', '-o', 'addr', 'show', 'scope', 'global'], { encoding: 'utf8' });
  for (const line of out.split('\n')) {
    const match = /^\d+:\s+(\S+)\s+inet\s+(\d+\.\d+\.\d+\.\d+)\//.exec(line);
    if (match && !match[1]!.startsWith('sg')) return match[2]!;
  }
  throw new Error(`No global IPv4 address on this host: ${out}`);
}

/** A TCP server on `host` that answers every connection with `<name> secret`. */
async function secretServer(name: string, host: string): Promise<{ server: Server; port: number }> {
  const server = createServer((socket) => socket.end(`${name} secret\n`));
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, resolve);
  });
  return { server, port: (server.address() as AddressInfo).port };
}

async function probe(sandbox: Sandbox, targets: Target[], door?: string): Promise<Outcome[]> {
  const result = await sandbox.exec(
    ['python3', '-c', PROBE, JSON.stringify(targets), ...(door ? [door] : [])],
    {
      timeoutMs: 180_000,
    },
  );
  expect(result.exitCode, `${sandbox.id}: ${result.stderr}`).toBe(0);
  return JSON.parse(result.stdout) as Outcome[];
}

/** The sandbox's default gateway (from /proc: Debian's image has no `ip`): the node network's bridge. */
async function gatewayOf(sandbox: Sandbox): Promise<string> {
  const routes = (await sandbox.readFile('/proc/net/route')).toString();
  const hex = /^\S+\s+00000000\s+([0-9A-F]{8})/m.exec(routes)?.[1] ?? '';
  // little-endian, as the kernel writes it
  const gateway = [6, 4, 2, 0].map((at) => parseInt(hex.slice(at, at + 2), 16)).join('.');
  expect(gateway, `${sandbox.id} has no default route: ${routes}`).toMatch(/^100\.\d+\.\d+\.\d+$/);
  return gateway;
}

async function eth0Of(sandbox: Sandbox): Promise<string> {
  const out = await sandbox.exec(['sh', '-c', "ip -o -4 addr show eth0 | awk '{print $4}' | cut -d/ -f1"]);
  return out.stdout.trim();
}

/** What a GET of the upstream's /id on `port` printed, or `refused`. */
async function fetchUpstream(sandbox: Sandbox, port: number): Promise<string> {
  const result = await sandbox.exec(
    ['sh', '-c', `timeout 5 wget -q -O - http://${UPSTREAM}:${port}/id 2>/dev/null || echo refused`],
    { timeoutMs: 15_000 },
  );
  const answer = result.stdout.trim();
  if (answer === 'refused') expectUpstreamStanding();
  return answer;
}

/** Fails, saying so, when the upstream's namespace is gone: a refusal then proves nothing. */
function expectUpstreamStanding(): void {
  const namespaces = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  expect(
    namespaces,
    `the upstream's namespace is gone (did another test run's clean-up remove it?)`,
  ).toContain(`upstream${UPSTREAM_INDEX}`);
}

async function networkNamespaceOf(sandbox: Sandbox): Promise<string> {
  return (await sandbox.exec(['readlink', '/proc/self/ns/net'])).stdout.trim();
}

/** The directed broadcast of the /20 a gateway is on. */
function broadcastOf(gateway: string): string {
  const n = gateway.split('.').reduce((sum, part) => sum * 256 + Number(part), 0) | 0xfff;
  return [24, 16, 8, 0].map((shift) => (n >>> shift) & 255).join('.');
}

/**
 * The network a tenant's rules may reach is what the operator granted its project, and never the
 * node host (any address, any port, the bridge it routes through), loopback, link-local and
 * metadata, the cluster's control plane, or another tenant's sandbox: whatever a tenant (through
 * the controller), an operator's rule book or a task names.
 */
describe('network grants and the guard', () => {
  let host = '';
  let dataDir = '';
  let cluster: InProcessCluster;
  let embedded: TestPlatform;
  let upstream: Upstream;
  const clients: Partial<Record<keyof typeof TOKENS, RemotePlatform>> = {};
  const servers: Server[] = [];
  /** Ports of the node host's secret servers, by where they listen. */
  const ports = { everywhere: 0, host: 0, loopback: 0, secondary: 0 };
  /** The bridge gateways servers were started on, and their ports. */
  const gatewayPorts = new Map<string, number>();
  let udp: Socket;
  const datagrams: string[] = [];
  let victim: Sandbox;
  let victimAddress = '';

  const client = (name: keyof typeof TOKENS): RemotePlatform => clients[name]!;

  beforeAll(async () => {
    host = hostAddress();
    for (const route of FALLBACK_ROUTES) execFileSync('ip', ['route', 'replace', 'unreachable', route]);
    udp = createSocket('udp4');
    udp.on('message', (message, from) => datagrams.push(`${from.address}: ${message.toString()}`));
    await new Promise<void>((resolve) => udp.bind(0, '0.0.0.0', resolve));

    const ruleBook = {
      'mirror:test': [`${UPSTREAM}:8080`],
      'mirror:other': [`${UPSTREAM}:8081`],
      // names an operator's rule book might give the node host's own addresses and worse
      'alias:host': [host, SECONDARY, UPSTREAM_LINK],
      'alias:loopback': ['127.0.0.0/8'],
      'alias:sandboxes': ['100.64.0.0/10'],
      'alias:metadata': ['169.254.0.0/16'],
      'alias:halves': ['0.0.0.0/1', '128.0.0.0/1'],
      'dns-local': ['127.0.0.53:53', `${host}:53`],
    };
    dataDir = join(TEST_DATA_ROOT, `network-grants-${randomBytes(4).toString('hex')}`);
    cluster = await startInProcessCluster({
      dataDir,
      storeDir: STORE_DIR,
      nodeId: 'netnode',
      grants: GRANTS,
      platform: { networkRules: ruleBook, controlPlane: [`:${CONTROLLER_PORT}`] },
      node: { metricsListen: '127.0.0.1:0' },
      controller: { metricsListen: `${host}:0`, metricsToken: METRICS_TOKEN },
    });
    upstream = await startUpstream(
      UPSTREAM_INDEX,
      [8080, 8081, CONTROLLER_PORT, cluster.node.port, cluster.node.metricsPort],
      { aliases: [LINK_LOCAL, OTHER_NODE_SANDBOX] },
    );
    // the address goes with the link
    execFileSync('ip', ['addr', 'add', `${SECONDARY}/32`, 'dev', `sgtu${UPSTREAM_INDEX}`]);
    for (const [name, address] of [
      ['everywhere', '::'],
      ['host', host],
      ['loopback', '127.0.0.1'],
      ['secondary', SECONDARY],
    ] as const) {
      const { server, port } = await secretServer(name, address);
      servers.push(server);
      ports[name] = port;
    }
    // an embedded platform on the same host knows the control plane it is told of
    embedded = await createTestPlatform('network-grants', {
      networkRules: ruleBook,
      controlPlane: [`:${CONTROLLER_PORT}`, `:${cluster.node.port}`, `:${cluster.node.metricsPort}`],
    });
    for (const name of Object.keys(TOKENS) as (keyof typeof TOKENS)[])
      clients[name] = await Platform.connect(cluster.url, { token: TOKENS[name] });

    // another tenant's sandbox, with egress (an address on the node network) and a server
    victim = await client('beta').createSandbox({
      environment: 'busybox:latest',
      network: ['cidr:0.0.0.0/0'],
    });
    await victim.exec(['sh', '-c', 'mkdir -p /srv && echo beta secret > /srv/id && httpd -p 9000 -h /srv']);
    victimAddress = await eth0Of(victim);
  });

  afterAll(async () => {
    for (const step of [
      ...Object.values(clients).map((c) => () => c.close()),
      () => cluster?.close(),
      async () => embedded?.[Symbol.asyncDispose](),
      async () => upstream?.[Symbol.asyncDispose](),
      () => rm(dataDir, { recursive: true, force: true }),
    ]) {
      await step()?.catch((error: unknown) => console.error(error));
    }
    for (const server of servers) server.close();
    udp?.close();
    for (const route of FALLBACK_ROUTES)
      execFileSync('sh', ['-c', `ip route del unreachable ${route} 2>/dev/null; true`]);
  });

  /** A secret server on a bridge gateway (an address the node host has only while sandboxes have egress). */
  async function gatewayPort(gateway: string): Promise<number> {
    let port = gatewayPorts.get(gateway);
    if (port === undefined) {
      const started = await secretServer('gateway', gateway);
      servers.push(started.server);
      port = started.port;
      gatewayPorts.set(gateway, port);
    }
    return port;
  }

  /** Everything no sandbox may reach, as seen from one behind `gateway`. */
  async function forbidden(gateway: string): Promise<Target[]> {
    const tcp = (address: string, port: number): Target => ({ kind: 'tcp', host: address, port });
    const udpTo = (address: string): Target => ({ kind: 'udp', host: address, port: udpPort() });
    return [
      // the node host, on every address it has and every way of spelling them
      tcp(host, ports.host),
      tcp(host, ports.everywhere),
      tcp(host, ports.loopback),
      tcp(`::ffff:${host}`, ports.everywhere),
      tcp(SECONDARY, ports.secondary),
      tcp(SECONDARY, ports.everywhere),
      tcp(UPSTREAM_LINK, ports.everywhere),
      tcp(gateway, await gatewayPort(gateway)),
      tcp(gateway, ports.everywhere),
      tcp('127.0.0.1', ports.loopback),
      // the control plane: the controller's metrics on the host, the node's ports elsewhere
      tcp(host, cluster.controller.metricsPort),
      tcp(gateway, cluster.controller.metricsPort),
      tcp(UPSTREAM, CONTROLLER_PORT),
      tcp(UPSTREAM, cluster.node.port),
      tcp(UPSTREAM, cluster.node.metricsPort),
      // link-local (metadata), another node's sandboxes, another tenant's sandbox here
      tcp(LINK_LOCAL, 8080),
      tcp(OTHER_NODE_SANDBOX, 8080),
      tcp(victimAddress, 9000),
      // broadcast and multicast to whoever listens on the node
      udpTo(host),
      udpTo(gateway),
      udpTo(SECONDARY),
      udpTo('255.255.255.255'),
      udpTo(broadcastOf(gateway)),
      udpTo('224.0.0.1'),
    ];
  }

  function udpPort(): number {
    return udp.address().port;
  }

  /** Runs every forbidden probe and the upstream's port 8080 (which the rules allow) from `sandbox`. */
  async function expectOnlyUpstream(sandbox: Sandbox): Promise<void> {
    const gateway = await gatewayOf(sandbox);
    datagrams.length = 0;
    const outcomes = await probe(sandbox, [
      { kind: 'tcp', host: UPSTREAM, port: 8080 },
      ...(await forbidden(gateway)),
    ]);
    const [honest, ...attacks] = outcomes;
    if (!honest?.outcome.startsWith('connected')) expectUpstreamStanding();
    expect(honest?.outcome, 'the upstream its rules allow').toMatch(/^connected/);
    // a datagram that got through would have arrived by now: the refusals above took longer
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(
      {
        reached: attacks.filter((a) => !a.outcome.startsWith('failed:') && a.outcome !== 'sent'),
        datagrams,
      },
      `what ${sandbox.id} reached, and the datagrams the node host received`,
    ).toEqual({ reached: [], datagrams: [] });
  }

  it('keeps a tenant granted every address off the node host, the control plane and other tenants', () =>
    attack('network', 'cidr:0.0.0.0/0 through the controller', async () => {
      await using attacker = await client('alpha').createSandbox({
        environment: 'debian:bookworm',
        network: ['cidr:0.0.0.0/0'],
      });
      await expectOnlyUpstream(attacker);
      // a datagram that dies at the first router learns nothing of the node host's routes
      const ttl1 = (address: string): Target => ({ kind: 'ttl1', host: address, port: udpPort() });
      const gateway = await gatewayOf(attacker);
      const expiring = await probe(
        attacker,
        [host, gateway, UPSTREAM, UPSTREAM_LINK, LINK_LOCAL, OTHER_NODE_SANDBOX, victimAddress].map(ttl1),
        '',
      );
      // (the guard's own refusal, type 3, names only the address the sandbox sent to)
      expect(expiring.filter((a) => a.outcome.startsWith('icmp 11/'))).toEqual([]);
    }));

  it('holds the guard whatever the rules are spelled as, and after SetNetwork', () =>
    attack('network', 'halves, host:IP:PORT and ranges set after create', async () => {
      await using attacker = await client('alpha').createSandbox({ environment: 'debian:bookworm' });
      await attacker.setNetwork(['cidr:0.0.0.0/1', 'cidr:128.0.0.0/1']);
      await expectOnlyUpstream(attacker);
      const gateway = await gatewayOf(attacker);
      await attacker.setNetwork([
        `host:${UPSTREAM}:8080`,
        `host:${host}:${ports.host}`,
        `host:${host}`,
        `host:${SECONDARY}`,
        `host:${UPSTREAM_LINK}`,
        `host:${gateway}:${await gatewayPort(gateway)}`,
        `host:${gateway}`,
        `host:${victimAddress}:9000`,
        `host:${LINK_LOCAL}:8080`,
        `host:${UPSTREAM}:${CONTROLLER_PORT}`,
        `cidr:${UPSTREAM}/32:${cluster.node.port}`,
        'cidr:100.64.0.0/10',
        'cidr:169.254.0.0/16',
        'cidr:127.0.0.0/8',
        'cidr:224.0.0.0/4',
        'cidr:240.0.0.0/4',
        'cidr:0.0.0.0/8',
      ]);
      await expectOnlyUpstream(attacker);
    }));

  it("keeps the operator's own rule book off the node too: names that alias its addresses", () =>
    attack('network', 'rule-book aliases of the node through the embedded platform', async () => {
      await using attacker = await embedded.platform.createSandbox({
        environment: 'debian:bookworm',
        network: [
          'mirror:test',
          'alias:host',
          'alias:loopback',
          'alias:sandboxes',
          'alias:metadata',
          'alias:halves',
          'dns-local',
        ],
      });
      await expectOnlyUpstream(attacker);
      await attacker.setNetwork(['cidr:0.0.0.0/0']);
      await expectOnlyUpstream(attacker);
    }));

  it('refuses a create whose rules go beyond the project grant, however they are spelled', () =>
    attack('network', 'rules beyond the grant at create', async () => {
      const narrow = client('narrow');
      for (const rule of beyondNarrow()) {
        await expectCode(
          narrow.createSandbox({ environment: 'busybox:latest', network: [rule] }),
          'permission_denied',
          /is not granted to project narrow/,
        );
      }
      // one rule beyond the grant refuses the whole create
      await expectCode(
        narrow.createSandbox({ environment: 'busybox:latest', network: ['mirror:test', 'cidr:0.0.0.0/0'] }),
        'permission_denied',
      );
      // the granted ones, and a host or narrower range inside the granted cidr, on its port
      for (const rules of [['mirror:test'], [`host:${UPSTREAM}:8080`], [`cidr:${UPSTREAM}/31:8080`]]) {
        await using sandbox = await narrow.createSandbox({ environment: 'busybox:latest', network: rules });
        expect(await fetchUpstream(sandbox, 8080), rules.join(',')).toBe('port 8080');
        expect(await fetchUpstream(sandbox, 8081), rules.join(',')).toBe('refused');
      }
      expect(await narrow.listSandboxes()).toEqual([]);
    }));

  /** Rules the narrow project was not granted, spelled every way a tenant might try. */
  function beyondNarrow(): string[] {
    return [
      'cidr:0.0.0.0/0',
      'cidr:0.0.0.0/1',
      'cidr:128.0.0.0/1',
      `cidr:10.250.${UPSTREAM_INDEX}.0/29:8080`,
      `cidr:10.250.${UPSTREAM_INDEX}.0/30`,
      `host:${UPSTREAM}`,
      `host:${UPSTREAM}:8081`,
      `cidr:${UPSTREAM}/32:8081`,
      `host:${host}`,
      `host:${host}:${ports.host}`,
      `host:${victimAddress}:9000`,
      'mirror:other',
      'mirror:test:8081',
      'alias:host',
      'dns',
      'internet',
      `HOST:${UPSTREAM}:8080`,
    ];
  }

  it('refuses SetNetwork beyond the grant, and keeps the rules it had', () =>
    attack('network', 'rules beyond the grant through SetNetwork', async () => {
      await using sandbox = await client('narrow').createSandbox({
        environment: 'busybox:latest',
        network: ['mirror:test'],
      });
      for (const rule of beyondNarrow())
        await expectCode(sandbox.setNetwork([rule]), 'permission_denied', /not granted/);
      expect(await fetchUpstream(sandbox, 8080)).toBe('port 8080');
      expect(await fetchUpstream(sandbox, 8081)).toBe('refused');
    }));

  it('leaves out optional rules the grant lacks rather than granting them', () =>
    attack('network', 'optional rules beyond the grant', async () => {
      const narrow = client('narrow');
      {
        await using sandbox = await narrow.createSandbox({
          environment: 'busybox:latest',
          network: ['cidr:0.0.0.0/0?', 'internet?', 'mirror:other?', `host:${host}?`],
        });
        expect((await sandbox.exec(['ip', '-o', 'link'])).stdout).not.toContain('eth0');
        expect(await fetchUpstream(sandbox, 8080)).toBe('refused');
      }
      await using sandbox = await narrow.createSandbox({
        environment: 'busybox:latest',
        network: ['mirror:test', 'cidr:0.0.0.0/0?'],
      });
      expect(await fetchUpstream(sandbox, 8080)).toBe('port 8080');
      expect(await fetchUpstream(sandbox, 8081)).toBe('refused');
      await sandbox.setNetwork(['mirror:other?']);
      expect(await fetchUpstream(sandbox, 8081)).toBe('refused');
    }));

  it('gives a project without network in its grant loopback only', () =>
    attack('network', 'rules from a project granted none', async () => {
      const plain = client('plain');
      for (const rule of ['mirror:test', `host:${UPSTREAM}:8080`, 'cidr:0.0.0.0/0'])
        await expectCode(
          plain.createSandbox({ environment: 'busybox:latest', network: [rule] }),
          'permission_denied',
          /loopback only/,
        );
      await using sandbox = await plain.createSandbox({ environment: 'busybox:latest' });
      await expectCode(sandbox.setNetwork(['mirror:test']), 'permission_denied');
      expect(await fetchUpstream(sandbox, 8080)).toBe('refused');
    }));

  it("ignores a tenant's own grant and project headers", () =>
    attack('network', 'forged sandgym-network metadata', async () => {
      await using forger = await Platform.connect(cluster.url, {
        token: TOKENS.narrow,
        metadata: {
          'sandgym-network': JSON.stringify(['cidr:0.0.0.0/0']),
          'sandgym-project': 'alpha',
        },
      });
      await expectCode(
        forger.createSandbox({ environment: 'busybox:latest', network: ['cidr:0.0.0.0/0'] }),
        'permission_denied',
        /project narrow/,
      );
      await using sandbox = await forger.createSandbox({
        environment: 'busybox:latest',
        network: ['mirror:test'],
      });
      await expectCode(sandbox.setNetwork([`host:${host}`]), 'permission_denied');
      expect((await client('alpha').listSandboxes()).map((s) => s.id)).not.toContain(sandbox.id);
    }));

  it('gives copies of a sandbox no rules beyond the grant', () =>
    attack('network', 'fork to widen the rules', async () => {
      const narrow = client('narrow');
      await using source = await narrow.createSandbox({
        environment: 'busybox:latest',
        network: ['mirror:test'],
      });
      await using group = await narrow.fork(source, 1);
      const [copy] = group.sandboxes;
      expect(await fetchUpstream(copy!, 8081)).toBe('refused');
      await expectCode(copy!.setNetwork(['cidr:0.0.0.0/0']), 'permission_denied');
      await expectCode(copy!.setNetwork([`host:${UPSTREAM}:8081`]), 'permission_denied');
    }));

  it('serves metrics beyond loopback only to a scrape with the metrics token', () =>
    attack('network', 'scrape project names from /metrics', async () => {
      const start = (metricsListen: string, metricsToken?: string) =>
        Controller.start({
          listen: '127.0.0.1:0',
          nodes: [`127.0.0.1:${cluster.node.port}`],
          nodeToken: IN_PROCESS_NODE_TOKEN,
          grants: GRANTS,
          logger: silentLogger(),
          metricsListen,
          ...(metricsToken ? { metricsToken } : {}),
        });
      // beyond loopback without a token: refused, naming the option
      const open = start(`${host}:0`);
      await expectCode(open, 'invalid_argument', /--metrics-token-file/);
      await (await open.catch(() => undefined))?.close();
      // a port alone is loopback's
      const local = await start('0');
      try {
        expect((await fetch(`http://127.0.0.1:${local.metricsPort}/metrics`)).status).toBe(200);
        await expect(fetch(`http://${host}:${local.metricsPort}/metrics`)).rejects.toThrow();
      } finally {
        await local.close();
      }
      // the cluster's controller serves them on the host's address, behind the token
      await using made = await client('alpha').createSandbox({ environment: 'busybox:latest' });
      const url = `http://${host}:${cluster.controller.metricsPort}/metrics`;
      for (const authorization of [undefined, `Bearer ${TOKENS.alpha}`, `Bearer ${IN_PROCESS_NODE_TOKEN}`]) {
        const response = await fetch(url, authorization ? { headers: { authorization } } : {});
        expect(response.status, authorization ?? 'no token').toBe(401);
        expect(await response.text()).not.toContain('alpha');
      }
      const scraped = await fetch(url, { headers: { authorization: `Bearer ${METRICS_TOKEN}` } });
      expect(await scraped.text()).toContain('project="alpha"');
      // and Prometheus, given the token, scrapes them
      await using prometheus = await startPrometheus(
        join(dataDir, 'prometheus'),
        [`${host}:${cluster.controller.metricsPort}`],
        METRICS_TOKEN,
      );
      await waitUntil(
        async () => (await prometheus.query('sandgym_controller_creates_total{project="alpha"}')).length > 0,
        'Prometheus scraping the controller with the token',
        30_000,
      );
      expect(made.id).toBeTruthy();
    }));

  it('keeps a group network member off the node host, through grp0 whatever the routes say', () =>
    attack('network', 'group member sends to the node host out of grp0', async () => {
      const group = await embedded.platform.createGroupNetwork();
      try {
        // a task's service: loopback and its group only; and one that has egress besides
        await using attacker = await embedded.platform.createSandbox({ environment: 'debian:bookworm' });
        await using wide = await embedded.platform.createSandbox({
          environment: 'debian:bookworm',
          network: ['cidr:0.0.0.0/0'],
        });
        const [attackerAddress] = [await group.join(attacker), await group.join(wide)];
        const groupBroadcast = attackerAddress.replace(/\.\d+$/, '.255');
        const tcp = (address: string, port: number): Target => ({ kind: 'tcp', host: address, port });
        const udpTo = (address: string, kind: 'udp' | 'ttl1' = 'udp'): Target => ({
          kind,
          host: address,
          port: udpPort(),
        });
        const targets = [
          tcp(host, ports.host),
          tcp(host, ports.everywhere),
          tcp(SECONDARY, ports.secondary),
          tcp(UPSTREAM_LINK, ports.everywhere),
          tcp(host, cluster.controller.metricsPort),
          tcp(LINK_LOCAL, 8080),
          tcp(victimAddress, 9000),
          udpTo(host),
          udpTo(SECONDARY),
          udpTo(UPSTREAM_LINK),
          udpTo('255.255.255.255'),
          udpTo(groupBroadcast),
          udpTo(host, 'ttl1'),
          udpTo(UPSTREAM, 'ttl1'),
          udpTo(LINK_LOCAL, 'ttl1'),
        ];
        for (const sandbox of [attacker, wide]) {
          datagrams.length = 0;
          const outcomes = await probe(sandbox, targets, 'grp0');
          await new Promise((resolve) => setTimeout(resolve, 500));
          expect(
            {
              reached: outcomes.filter((a) => !a.outcome.startsWith('failed:') && a.outcome !== 'sent'),
              datagrams,
            },
            `what ${sandbox.id} reached out of grp0, and the datagrams the node host received`,
          ).toEqual({ reached: [], datagrams: [] });
        }
      } finally {
        await group.close();
      }
    }));

  it("gives a warm shell's next tenant none of its last tenant's group networks", () =>
    attack('network', 'a pooled shell keeps grp0', async () => {
      await using warm = await createTestPlatform('network-warm', { warmPool: { latency: 1 } });
      const { platform } = warm;
      await platform.warmPool.filled();
      const group = await platform.createGroupNetwork();
      const other = await platform.createGroupNetwork();
      try {
        await using service = await platform.createSandbox({ environment: 'busybox:latest' });
        const serviceAddress = await group.join(service);
        await service.exec(['sh', '-c', 'mkdir -p /srv && echo service > /srv/id && httpd -p 9000 -h /srv']);
        // the first tenant ends without leaving its group: its shell goes back to the pool
        const first = await platform.createSandbox({ environment: 'debian:bookworm' });
        const namespace = await networkNamespaceOf(first);
        try {
          await group.join(first);
          expect(await probe(first, [{ kind: 'tcp', host: serviceAddress, port: 9000 }])).toMatchObject([
            { outcome: expect.stringMatching(/^connected/) as unknown },
          ]);
        } finally {
          await first.close();
        }
        await platform.warmPool.recycled();
        await using second = await platform.createSandbox({ environment: 'debian:bookworm' });
        expect(await networkNamespaceOf(second), 'the very same container').toBe(namespace);
        const links = (await second.readFile('/proc/net/dev')).toString();
        expect(
          links
            .split('\n')
            .slice(2)
            .map((l) => l.split(':')[0]!.trim())
            .filter(Boolean),
        ).toEqual(['lo']);
        const reached = await probe(second, [{ kind: 'tcp', host: serviceAddress, port: 9000 }]);
        expect(reached[0]?.outcome).toMatch(/^failed:/);
        // honest: the next tenant joins a group of its own and reaches only that one's members
        await using peer = await platform.createSandbox({ environment: 'busybox:latest' });
        const peerAddress = await other.join(peer);
        await peer.exec(['sh', '-c', 'mkdir -p /srv && echo peer > /srv/id && httpd -p 9000 -h /srv']);
        await other.join(second);
        const mine = await probe(second, [
          { kind: 'tcp', host: peerAddress, port: 9000 },
          { kind: 'tcp', host: serviceAddress, port: 9000 },
        ]);
        expect(mine.map((o) => o.outcome.replace(/:.*/, ''))).toEqual(['connected', 'failed']);
      } finally {
        await group.close();
        await other.close();
      }
    }));

  it("forgets a sandbox's flows when its rules narrow and when its address is freed", () =>
    attack('network', 'flows outliving their rule, and a recycled address', async () => {
      const pusher = spawn(
        'ip',
        ['netns', 'exec', `sandgym-test-upstream${UPSTREAM_INDEX}`, 'python3', '-c', PUSHER],
        { stdio: 'ignore' },
      );
      const pushed = async (sandbox: Sandbox): Promise<number> =>
        Number((await sandbox.readFile('/tmp/pushed').catch(() => Buffer.from('0'))).toString());
      const listen = (sandbox: Sandbox, hello: boolean): Promise<unknown> =>
        sandbox.exec([
          'sh',
          '-c',
          `python3 -c "$0" ${hello ? 'hello' : 'quiet'} ${UPSTREAM} >/dev/null 2>&1 &`,
          LISTENER,
        ]);
      /** Datagrams that arrive over a second and a half (a live flow brings some 15). */
      const arriving = async (sandbox: Sandbox): Promise<number> => {
        const before = await pushed(sandbox);
        await new Promise((resolve) => setTimeout(resolve, 1500));
        return (await pushed(sandbox)) - before;
      };
      try {
        const first = await embedded.platform.createSandbox({
          environment: 'debian:bookworm',
          network: [`host:${UPSTREAM}:${PUSH_PORT}`],
        });
        let address = '';
        try {
          address = (await first.exec(['hostname', '-I'])).stdout.trim();
          await listen(first, true);
          await waitUntil(async () => (await pushed(first)) > 0, 'the pushed flow');
          // the rule goes: the flow it let in goes with it
          await first.setNetwork([]);
          expect(await arriving(first), 'datagrams after the rule went').toBeLessThanOrEqual(1);
          // back on the rule: the flow starts afresh, and the sandbox ends with it open
          await first.setNetwork([`host:${UPSTREAM}:${PUSH_PORT}`]);
          const sofar = await pushed(first);
          await waitUntil(async () => (await pushed(first)) > sofar + 1, 'the flow again');
        } finally {
          await first.close();
        }
        // the next sandbox on the same address, listening where the first was, never says hello
        await using second = await embedded.platform.createSandbox({
          environment: 'debian:bookworm',
          network: [`host:${UPSTREAM}:8080`],
        });
        expect((await second.exec(['hostname', '-I'])).stdout.trim(), 'a recycled address').toBe(address);
        await listen(second, false);
        // its rules work, and the host learns its new link address
        const [honest] = await probe(second, [{ kind: 'tcp', host: UPSTREAM, port: 8080 }]);
        expect(honest?.outcome).toMatch(/^connected/);
        expect(await arriving(second), "datagrams of the first sandbox's flow").toBe(0);
      } finally {
        pusher.kill('SIGKILL');
      }
    }));

  it('narrows the rules of a sandbox adopted after its node died, and keeps the rules it had', () =>
    attack('network', 'SetNetwork on an adopted sandbox', async () => {
      const dataDir = join(TEST_DATA_ROOT, `network-adopt-${randomBytes(4).toString('hex')}`);
      // the first owner gives a durable sandbox the upstream's /30, narrows it, and dies
      const first = spawnSync(
        process.execPath,
        [
          '--input-type=module',
          '-e',
          `
const { Platform } = await import(${JSON.stringify(resolve('dist/src/index.js'))});
const platform = await Platform.local({ dataDir: process.env.DATA, storeDir: process.env.STORE, durable: true });
const sandbox = await platform.createSandbox({ environment: 'busybox:latest', network: ['cidr:10.250.${UPSTREAM_INDEX}.0/30'] });
await sandbox.setNetwork(['host:${UPSTREAM}:8080', 'host:${UPSTREAM}:8081']);
console.log(JSON.stringify({ id: sandbox.id }));
process.exit(0);
`,
        ],
        { env: { ...process.env, DATA: dataDir, STORE: STORE_DIR }, encoding: 'utf8', timeout: 120_000 },
      );
      expect(first.status, first.stderr).toBe(0);
      const { id } = JSON.parse(first.stdout) as { id: string };
      const successor = await Platform.local({ dataDir, storeDir: STORE_DIR, durable: true });
      try {
        const adopted = await successor.adoptSandboxes();
        expect(adopted.map((s) => s.id)).toEqual([id]);
        const sandbox = adopted[0]!;
        const reach = async (): Promise<string[]> =>
          Promise.all([8080, 8081, CONTROLLER_PORT].map((port) => fetchUpstream(sandbox, port)));
        // the rules it had when its owner died, and not the wider ones it was created with
        expect(await reach()).toEqual(['port 8080', 'port 8081', 'refused']);
        // narrowed to nothing first: its veth of the dead owner's network must not keep its rules
        await sandbox.setNetwork([]);
        expect(await reach()).toEqual(['refused', 'refused', 'refused']);
        await sandbox.setNetwork([`host:${UPSTREAM}:8080`]);
        expect(await reach()).toEqual(['port 8080', 'refused', 'refused']);
        await sandbox.close();
      } finally {
        await successor.gc().catch(() => undefined);
        await successor.close();
        await rm(dataDir, { recursive: true, force: true });
      }
    }));

  it('applies overlapping SetNetwork calls in the order they came: the last one holds', () =>
    attack('network', 'overlapping SetNetwork calls, the wider one last to commit', async () => {
      const narrow = `host:${UPSTREAM}:8080`;
      await using sandbox = await embedded.platform.createSandbox({
        environment: 'busybox:latest',
        network: [narrow],
      });
      const reached: number[] = [];
      for (let round = 0; round < 12; round++) {
        await Promise.all([
          sandbox.setNetwork([narrow, `host:${UPSTREAM}:8081`]),
          sandbox.setNetwork([narrow]),
        ]);
        const wider = await sandbox.exec([
          'sh',
          '-c',
          `timeout 2 wget -q -O - http://${UPSTREAM}:8081/id 2>/dev/null || echo refused`,
        ]);
        if (wider.stdout.trim() !== 'refused') reached.push(round);
      }
      expect(reached, 'rounds in which the rules asked last did not hold').toEqual([]);
      // the honest twin: the rule asked last is the one that holds
      expect(await fetchUpstream(sandbox, 8080)).toBe('port 8080');
    }));

  it('honest: group members reach each other on their group, with or without egress', async () => {
    const group = await embedded.platform.createGroupNetwork();
    try {
      await using client = await embedded.platform.createSandbox({ environment: 'debian:bookworm' });
      await using service = await embedded.platform.createSandbox({
        environment: 'busybox:latest',
        network: [`host:${UPSTREAM}:8080`],
      });
      await group.join(client);
      const serviceAddress = await group.join(service);
      await service.exec(['sh', '-c', 'mkdir -p /srv && echo service > /srv/id && httpd -p 9000 -h /srv']);
      const outcomes = await probe(client, [{ kind: 'tcp', host: serviceAddress, port: 9000 }], 'grp0');
      expect(outcomes[0]?.outcome).toMatch(/^connected/);
      const plain = await probe(client, [{ kind: 'tcp', host: serviceAddress, port: 9000 }]);
      expect(plain[0]?.outcome).toMatch(/^connected/);
      expect(await fetchUpstream(service, 8080)).toBe('port 8080');
    } finally {
      await group.close();
    }
  });

  it('honest: a group member that hibernates and resumes is still on its group', async () => {
    const group = await embedded.platform.createGroupNetwork();
    try {
      await using service = await embedded.platform.createSandbox({ environment: 'busybox:latest' });
      await using member = await embedded.platform.createSandbox({ environment: 'busybox:latest' });
      const serviceAddress = await group.join(service);
      await group.join(member);
      await service.exec(['sh', '-c', 'mkdir -p /srv && echo service > /srv/id && httpd -p 9000 -h /srv']);
      const fetch = async (): Promise<string> =>
        (
          await member.exec([
            'sh',
            '-c',
            `timeout 5 wget -q -O - http://${serviceAddress}:9000/id 2>/dev/null || echo refused`,
          ])
        ).stdout.trim();
      expect(await fetch()).toBe('service');
      await member.hibernate();
      await member.resume();
      expect(await fetch()).toBe('service');
    } finally {
      await group.close();
    }
  });

  it('honest: a granted host, a range inside a granted cidr, and the rule book reach their server', async () => {
    await using sandbox = await client('narrow').createSandbox({
      environment: 'busybox:latest',
      network: [`host:${UPSTREAM}:8080`],
    });
    expect(await fetchUpstream(sandbox, 8080)).toBe('port 8080');
    await sandbox.setNetwork(['mirror:test', `cidr:10.250.${UPSTREAM_INDEX}.0/30:8080`]);
    expect(await fetchUpstream(sandbox, 8080)).toBe('port 8080');
    await using mine = await embedded.platform.createSandbox({
      environment: 'busybox:latest',
      network: ['mirror:other', `host:${UPSTREAM}:8080`],
    });
    expect(await fetchUpstream(mine, 8080)).toBe('port 8080');
    expect(await fetchUpstream(mine, 8081)).toBe('port 8081');
  });
});
