import { spawn, type ChildProcess } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { addressOf, flowsOf } from '../support/node-network.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';
import { attack } from './summary.ts';

/** Kept apart from the other upstream indexes (pooled-network.test.ts takes 11). */
const UPSTREAM_INDEX = 33;
/** The port of a server that accepts connections and never reads them (a stalled peer). */
const STALLED_PORT = 9000;
/** A port a task's own server commonly listens on. */
const SQUATTED_PORT = 8000;
const STALLED_HEX = STALLED_PORT.toString(16).toUpperCase().padStart(4, '0');

/** The TCP sockets of the sandbox's network namespace with the stalled port as remote port. */
async function socketsToStalled(sandbox: Sandbox): Promise<string[]> {
  const table = await sandbox.exec(['cat', '/proc/net/tcp']);
  return table.stdout
    .split('\n')
    .slice(1)
    .filter((line) => line.trim().split(/\s+/)[2]?.endsWith(`:${STALLED_HEX}`));
}

/** Bytes the sandbox's eth0 sent so far, as its namespace's /proc/net/dev counts them. */
async function bytesSent(sandbox: Sandbox): Promise<number> {
  const table = await sandbox.exec(['cat', '/proc/net/dev']);
  const line = table.stdout.split('\n').find((l) => l.trim().startsWith('eth0:')) ?? '';
  return Number(line.split(':')[1]?.trim().split(/\s+/)[8] ?? Number.NaN);
}

/** Runs a perl program that opens a TCP socket `S` (perl-base is in every Debian image). */
function perlSocket(sandbox: Sandbox, program: string) {
  return sandbox.exec([
    'perl',
    '-MSocket',
    '-e',
    `socket(S, PF_INET, SOCK_STREAM, 0) or die "socket: $!";\n${program}`,
  ]);
}

/** Polls `probe` until it returns true or `rounds` half-seconds passed; whether it ever did. */
async function becomes(probe: () => Promise<boolean> | boolean, rounds: number): Promise<boolean> {
  for (let round = 0; round < rounds; round++) {
    if (await probe()) return true;
    await sleep(500);
  }
  return probe();
}

/**
 * Second attacker on the pooled shell's kept veth (redpool). The tenant before controls every
 * process and byte of its sandbox, but not what the kernel keeps for it after its processes are
 * gone: a TCP socket closed with data still unsent is orphaned, not freed, and goes on sending
 * from the namespace's address (zero-window probes, retransmits) for up to minutes. Five of these
 * broke the first landing (the link counters, the connection seen, the flow revived, the framed
 * refusals, the squatted port); the scrub now ends every socket of the namespace, fails closed
 * when any is left, and replaces a veth that carried traffic.
 */
describe("a pooled container's kept network against the last tenant's orphaned sockets", () => {
  let env: TestPlatform;
  let upstream: Upstream;
  let stalled: ChildProcess | undefined;

  beforeAll(async () => {
    upstream = await startUpstream(UPSTREAM_INDEX, [8080, 8081]);
    // accepts and holds every connection without reading: a sender's window closes, its data waits
    stalled = spawn(
      'ip',
      [
        ...['netns', 'exec', `sandgym-test-upstream${UPSTREAM_INDEX}`, 'python3', '-c'],
        `import socket,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.bind(('${upstream.address}', ${STALLED_PORT})); s.listen(16); held=[]
while True: held.append(s.accept()[0])`,
      ],
      { stdio: 'ignore' },
    );
    env = await createTestPlatform('pooled-network-red', {
      warmPool: { latency: 1 },
      networkRules: {
        'mirror:first': [`${upstream.address}:8080`, `${upstream.address}:${STALLED_PORT}`],
        'mirror:second': [`${upstream.address}:8081`],
      },
    });
    await env.platform.warmPool.filled(60_000);
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
    stalled?.kill('SIGKILL');
    await upstream?.[Symbol.asyncDispose]();
  });

  /** A tenant on the one pooled shell: the last one's container, scrubbed. */
  async function nextTenant(network: string[], environment = 'busybox:latest'): Promise<Sandbox> {
    await env.platform.warmPool.recycled();
    return env.platform.createSandbox({ environment, network });
  }

  /**
   * The first tenant: streams to the stalled server until its window is shut, and leaves the
   * sender running for the scrub to kill; its socket is orphaned with data unsent. Its address.
   */
  async function leaveOrphan(): Promise<string> {
    const first = await nextTenant(['mirror:first']);
    try {
      const address = await addressOf(first);
      expect(address).not.toBe('');
      await first.exec([
        'sh',
        '-c',
        `nc ${upstream.address} ${STALLED_PORT} </dev/zero >/dev/null 2>&1 & sleep 2; exit 0`,
      ]);
      expect(await socketsToStalled(first)).not.toEqual([]); // established, its send queue full
      return address;
    } finally {
      await first.close();
    }
  }

  it('honest twin: a tenant whose streams all ended leaves the next tenant nothing', () =>
    attack('pooled-network', 'leave nothing after a clean fetch', async () => {
      const first = await nextTenant(['mirror:first']);
      try {
        const fetched = await first.exec(['sh', '-c', `wget -q -O - http://${upstream.address}:8080/id`]);
        expect(fetched.stdout.trim()).toBe('port 8080');
      } finally {
        await first.close();
      }
      const second = await nextTenant(['mirror:second']);
      try {
        expect(await socketsToStalled(second)).toEqual([]);
        const stats = await second.stats();
        expect(stats.deniedEgress).toBe(0);
        expect(stats.network?.denied ?? []).toEqual([]);
      } finally {
        await second.close();
      }
    }));

  it("the next tenant's link counters start from nothing", () =>
    attack('pooled-network', "read the last tenant's traffic off the kept veth", async () => {
      const first = await nextTenant(['mirror:first']);
      let sent: number;
      try {
        await first.exec([
          'sh',
          '-c',
          `i=0; while [ $i -lt 50 ]; do wget -q -O /dev/null http://${upstream.address}:8080/id; i=$((i+1)); done`,
        ]);
        sent = await bytesSent(first);
        expect(sent).toBeGreaterThan(0);
      } finally {
        await first.close();
      }
      const second = await nextTenant(['mirror:first']);
      try {
        // what the link carried before this tenant ran anything: the last tenant's volume
        expect(await bytesSent(second)).toBeLessThan(sent);
      } finally {
        await second.close();
      }
    }));

  it("the next tenant sees none of the last tenant's connections", () =>
    attack('pooled-network', "hand the next tenant the last one's orphaned socket", async () => {
      await leaveOrphan();
      const second = await nextTenant(['mirror:first']);
      try {
        // the last tenant's stream to the stalled server, still in the namespace it now holds
        expect(await socketsToStalled(second)).toEqual([]);
      } finally {
        await second.close();
      }
    }));

  it('no flow of the last tenant comes back on the kept address', () =>
    attack('pooled-network', 'revive a flow after the scrub forgot it', async () => {
      const address = await leaveOrphan();
      await env.platform.warmPool.recycled();
      // the scrub forgot every flow; the orphaned socket's next probe makes one again
      expect(await becomes(() => flowsOf(address).includes(`dport=${STALLED_PORT}`), 20)).toBe(false);
    }));

  it("the next tenant's count and record hold only refusals it made", () =>
    attack('pooled-network', "frame the next tenant with the last one's refused egress", async () => {
      await leaveOrphan();
      const second = await nextTenant(['mirror:second']);
      try {
        // it sends nothing; the orphan's probes meet its narrower rules, counted as its own
        const framed = await becomes(async () => {
          const stats = await second.stats();
          return stats.deniedEgress > 0 || (stats.network?.denied ?? []).length > 0;
        }, 30);
        const stats = await second.stats();
        expect({ framed, denied: stats.deniedEgress, record: stats.network?.denied ?? [] }).toEqual({
          framed: false,
          denied: 0,
          record: [],
        });
      } finally {
        await second.close();
      }
    }));
  it('a tenant whose rules allow nothing gets loopback only, orphans of the last one or not', () =>
    attack('pooled-network', 'keep a veth for a tenant that allows nothing', async () => {
      await leaveOrphan();
      const second = await nextTenant([]);
      try {
        expect(await addressOf(second)).toBe('');
        expect((await second.exec(['ip', '-o', 'link'])).stdout).not.toContain('eth0');
        const tried = await second.exec([
          'sh',
          '-c',
          `wget -q -T 3 -O - http://${upstream.address}:8080/id 2>/dev/null || echo refused`,
        ]);
        expect(tried.stdout.trim()).toBe('refused');
      } finally {
        await second.close();
      }
    }));

  it('counts every refusal however the readings race its packets', () =>
    attack('pooled-network', 'slip a refusal between a quiet reading and its check', async () => {
      const sandbox = await nextTenant(['mirror:first']);
      try {
        const attempts = 200;
        await sandbox.exec([
          'sh',
          '-c',
          // each attempt on its own (a refused SYN waits out -w), spread over a few seconds
          `(i=0; while [ $i -lt ${attempts} ]; do nc -w 1 ${upstream.address} 8081 </dev/null >/dev/null 2>&1 &
            i=$((i+1)); echo $i >/tmp/tried; usleep 10000; done; wait; touch /tmp/done) >/dev/null 2>&1 &`,
        ]);
        // readings as close together as the platform allows, while refusals keep coming
        const done = async (): Promise<boolean> =>
          (await sandbox.exec(['sh', '-c', 'test -e /tmp/done && echo y || true'])).stdout.trim() === 'y';
        while (!(await done())) await Promise.all([sandbox.stats(), sandbox.stats(), sandbox.stats()]);
        const tried = Number((await sandbox.exec(['cat', '/tmp/tried'])).stdout.trim());
        expect(tried).toBe(attempts);
        expect((await sandbox.stats()).deniedEgress).toBeGreaterThanOrEqual(attempts);
      } finally {
        await sandbox.close();
      }
    }));
  it("a port the last tenant's socket held is free for the next tenant's server", () =>
    attack('pooled-network', "squat the next tenant's server port from an orphaned socket", async () => {
      const first = await nextTenant(['mirror:first'], 'debian:bookworm');
      try {
        // its stream to the stalled server leaves from the port the next tenant's server wants,
        // and is cut off mid-write: the socket is orphaned with its data unsent
        const streamed = await perlSocket(
          first,
          `bind(S, sockaddr_in(${SQUATTED_PORT}, INADDR_ANY)) or die "bind: $!";
           connect(S, sockaddr_in(${STALLED_PORT}, inet_aton("${upstream.address}"))) or die "connect: $!";
           $SIG{ALRM} = sub { exit 0 }; alarm 2; syswrite(S, "x" x 65536) while 1;`,
        );
        expect(streamed.stderr).toBe('');
        expect(await socketsToStalled(first)).not.toEqual([]);
      } finally {
        await first.close();
      }
      // a server as most programs make one: bind without SO_REUSEADDR (perl-base, in every Debian)
      const second = await nextTenant(['mirror:first'], 'debian:bookworm');
      try {
        const served = await perlSocket(
          second,
          `bind(S, sockaddr_in(${SQUATTED_PORT}, INADDR_ANY)) or die "bind: $!\\n";
           listen(S, 5) or die "listen: $!"; print "listening\\n";`,
        );
        expect(`${served.stdout}${served.stderr}`.trim()).toBe('listening');
      } finally {
        await second.close();
      }
    }));
});
