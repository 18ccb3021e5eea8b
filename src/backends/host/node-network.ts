import { randomBytes } from 'node:crypto';
import { mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { networkInterfaces } from 'node:os';
import { join } from 'node:path';
import { z } from 'zod';
import { SandgymError } from '../../common/index.ts';
import { NEVER_REACHED, type ControlPlane } from './egress-guard.ts';
import { DnsRelay } from './dns-relay.ts';
import { ipv4Number, prefixMask, type EgressTarget } from './network-rules.ts';
import { isAlive, processIdentity } from './processes.ts';
import { runProgram } from './run-program.ts';

/** Node subnets are /20s of the shared address space (RFC 6598), which no real network routes to a host. */
const SUBNETS = 1024;
const SUBNET_BITS = 20;
const HOSTS_PER_SUBNET = 2 ** (32 - SUBNET_BITS) - 3; // less network, gateway and broadcast
const CLAIMS_DIR = '/run/sandgym/subnets';

/** A sandbox's place on the node network. */
export interface NetworkAttachment {
  /** Its host number in the node subnet: names its veth, chain and counter. */
  index: number;
  address: string;
}

function addressOf(subnet: number, host: number): string {
  const n = 0x64400000 + subnet * 2 ** (32 - SUBNET_BITS) + host; // 100.64.0.0 + ...
  return [24, 16, 8, 0].map((shift) => (n >>> shift) & 255).join('.');
}

/**
 * The node's network for sandboxes whose policy lets them reach anything beyond loopback: a
 * bridge with its own /20, one veth pair per such sandbox (isolated bridge ports, so sandboxes
 * never reach each other), and one nftables table that lets each sandbox reach exactly its
 * current targets. Everything else is refused: new connections are counted per sandbox and
 * answered "administratively prohibited" so a scan fails fast; packets of connections a stage
 * switch closed are dropped.
 *
 * Every packet from the bridge meets the guard first, which no allow rule can override: it
 * refuses the node host itself (every address the kernel routes locally, the bridge's included,
 * whatever interface or secondary address it is on), broadcast and multicast, IPv6, packets the
 * host redirected elsewhere (DNAT: Docker's published ports, Kubernetes services), the ranges of
 * {@link NEVER_REACHED} (loopback, link-local and metadata, every node's sandboxes) and the
 * control plane the node knows ({@link guard}).
 *
 * Sandboxes with no egress never get a veth: their namespace holds loopback only.
 */
export class NodeNetwork {
  private readonly attached = new Map<number, NetworkAttachment>();
  /** What each attachment's rules allow now (`cidr` or `cidr:port`), to tell a narrowing. */
  private readonly allowed = new Map<number, Set<string>>();
  /** The sandboxes' resolver, when the node names resolvers (its `dns` rule). */
  private relay: DnsRelay | undefined;
  /** What the guard keeps sandboxes from now: the relay asks no resolver inside it. */
  private controlPlane: ControlPlane = { hosts: [], ports: [] };
  /** Each attachment's current targets, to narrow what it may ask the relay when the guard grows. */
  private readonly targets = new Map<number, readonly EgressTarget[]>();
  /**
   * What each attachment's counter and record last read, with how many packets its sandbox had
   * sent then: while that number stands, nothing new can have been refused (see {@link unlessQuiet}).
   */
  private readonly lastRead = new Map<number, QuietReading>();
  /**
   * When each attachment's record was last emptied (a new stage), as its veth's count of packets
   * from the sandbox then, and whether its flows were forgotten then too (see {@link reset}).
   */
  private readonly emptied = new Map<number, { sent: string; flowless: boolean }>();

  private constructor(
    private readonly subnet: number,
    private readonly stateFile: string,
    private readonly resolvers: readonly ResolverAddress[],
  ) {}

  get bridge(): string {
    return `sgbr${this.subnet}`;
  }

  get table(): string {
    return `sandgym${this.subnet}`;
  }

  private get gateway(): string {
    return addressOf(this.subnet, 1);
  }

  private get cidr(): string {
    return `${addressOf(this.subnet, 0)}/${SUBNET_BITS}`;
  }

  /**
   * Claims a subnet for this process on the node of `dataDir` (the one a dead predecessor had,
   * if it left one) and builds the bridge and table afresh, guarded against `controlPlane` from
   * the start. Processes sharing a data dir (two evals at once) each have their own:
   * networks/<pid>-<random>.json records whose is which.
   */
  static async open(
    dataDir: string,
    controlPlane: ControlPlane,
    resolvers: readonly ResolverAddress[] = [],
  ): Promise<NodeNetwork> {
    const previous = await removeStaleNetworks(dataDir);
    const subnet = await claimSubnet(previous[0]);
    const stateFile = join(dataDir, NETWORKS_DIR, `${process.pid}-${randomBytes(4).toString('hex')}.json`);
    const network = new NodeNetwork(subnet, stateFile, resolvers);
    await mkdir(join(dataDir, NETWORKS_DIR), { recursive: true });
    await writeFile(stateFile, JSON.stringify({ subnet, owner: await processIdentity(process.pid) }));
    try {
      await network.build(controlPlane);
    } catch (error) {
      await network.close().catch(() => undefined);
      throw error;
    }
    return network;
  }

  private async build(controlPlane: ControlPlane): Promise<void> {
    const bridge = this.bridge;
    this.controlPlane = controlPlane;
    await runProgram('sh', [
      '-c',
      `ip link add "$1" type bridge && ip addr add "$2" dev "$1" && ip link set "$1" up`,
      'sh',
      bridge,
      `${this.gateway}/${SUBNET_BITS}`,
    ]);
    // a node that gives sandboxes egress routes for them (as Docker's hosts do)
    await writeFile('/proc/sys/net/ipv4/ip_forward', '1');
    // on the bridge's own address, which nothing but the redirect below reaches
    // no resolver the guard would refuse: the relay must not carry a sandbox where no packet may go
    const resolvers = this.resolvers.filter((r) => !guarded(r, controlPlane));
    if (resolvers.length) this.relay = await DnsRelay.open(this.gateway, resolvers);
    // the table and its guard come in one transaction: no packet ever sees the bridge unguarded
    await nft(`
      table inet ${this.table} {
        map sandboxes { type ipv4_addr : verdict; }
        map denials { type ipv4_addr : counter; }
        map recorders { type ipv4_addr : verdict; }
        set never { type ipv4_addr; flags interval; auto-merge; elements = { ${NEVER_REACHED.join(', ')} }; }
        set control_hosts { type ipv4_addr; flags interval; auto-merge; }
        set control_ports { type inet_service; }
        chain refuse {
          ct state new ip saddr vmap @recorders
          ct state new counter name ip saddr map @denials
          reject with icmpx type admin-prohibited
        }
        chain guard {
          meta nfproto ipv6 goto refuse
          ct status dnat goto refuse
          fib daddr type { local, broadcast, multicast } goto refuse
          ip daddr @never goto refuse
          ip daddr @control_hosts goto refuse
          meta l4proto { tcp, udp } th dport @control_ports goto refuse
        }
        chain egress {
          jump guard
          ip saddr vmap @sandboxes
          drop
        }
        chain forward {
          type filter hook forward priority filter; policy accept;
          iifname "${bridge}" jump egress
        }
        chain input {
          type filter hook input priority filter; policy accept;
          ${this.relayInput()}
          iifname "${bridge}" jump egress
        }
        chain resolver {
          type nat hook prerouting priority dstnat; policy accept;
          ${this.relayRedirects()}
        }
        chain prerouting {
          type filter hook prerouting priority filter; policy accept;
          # the kernel answers a packet that expires here before any forward rule sees it: its
          # "time exceeded" would map the host's routes, the guarded ones included
          iifname "${bridge}" ip ttl <= 1 fib daddr type != local drop
        }
        chain postrouting {
          type nat hook postrouting priority srcnat; policy accept;
          ip saddr ${this.cidr} oifname != "${bridge}" masquerade
        }
      }
      ${this.controlPlaneScript(controlPlane)}`);
  }

  /**
   * Queries a sandbox sends to a resolver the node names go to the relay instead, each
   * resolver's to its own port (so the relay knows which was asked), whatever the sandbox's
   * rules: the relay answers those its rules do not reach with a refusal, and keeps the name.
   */
  private relayRedirects(): string {
    const relay = this.relay;
    if (!relay) return '';
    return this.resolvers
      .filter((r) => relay.portOf(`${r.address}:${r.port}`) !== undefined)
      .map(
        (r) =>
          `iifname "${this.bridge}" ip daddr ${r.address} udp dport ${r.port} ct state new dnat ip to ${this.gateway}:${relay.portOf(`${r.address}:${r.port}`)}`,
      )
      .join('\n');
  }

  /**
   * The one way in to the node from the bridge: a query the redirect above sent to the relay.
   * A packet sent to the relay's port directly was not redirected, and meets the guard.
   */
  private relayInput(): string {
    const relay = this.relay;
    if (!relay) return '';
    const ports = relay.resolvers.map((key) => relay.portOf(key));
    // a sandbox's queries are held to a rate before they reach the relay's socket, where a flood
    // from one would crowd out the others' (the relay's own allowance comes after)
    return `iifname "${this.bridge}" ip daddr ${this.gateway} udp dport { ${ports.join(', ')} } ct status dnat meter relay_rate { ip saddr limit rate over 200/second burst 400 packets } drop
          iifname "${this.bridge}" ip daddr ${this.gateway} udp dport { ${ports.join(', ')} } ct status dnat accept`;
  }

  /** Replaces the control plane the guard keeps every sandbox from, in one transaction. */
  async guard(controlPlane: ControlPlane): Promise<void> {
    await nft(this.controlPlaneScript(controlPlane));
    this.controlPlane = controlPlane;
    for (const [index, targets] of this.targets) {
      const attachment = this.attached.get(index);
      if (attachment) this.relay?.restrict(attachment.address, this.askable(targets));
    }
  }

  private controlPlaneScript({ hosts, ports }: ControlPlane): string {
    return [
      `flush set inet ${this.table} control_hosts`,
      `flush set inet ${this.table} control_ports`,
      ...(hosts.length ? [`add element inet ${this.table} control_hosts { ${hosts.join(', ')} }`] : []),
      ...(ports.length ? [`add element inet ${this.table} control_ports { ${ports.join(', ')} }`] : []),
    ].join('\n');
  }

  /** Gives the network namespace of `pid` a veth on the bridge, with everything denied until {@link allow}. */
  async attach(pid: number): Promise<NetworkAttachment> {
    const index = this.freeIndex();
    const attachment = { index, address: addressOf(this.subnet, index + 2) };
    this.attached.set(index, attachment);
    const host = this.hostVeth(index);
    const peer = `sgp${this.subnet}x${index}`;
    try {
      await this.allow(attachment, []);
      await runProgram('sh', [
        '-c',
        [
          'ip link add "$1" type veth peer name "$2"',
          'ip link set "$2" netns "$3"',
          'ip link set "$1" master "$4"',
          'bridge link set dev "$1" isolated on',
          // no IPv6 chatter of the host's end either: what the sandbox's link counts is its own
          'echo 1 > /proc/sys/net/ipv6/conf/"$1"/disable_ipv6',
          'ip link set "$1" up',
          // inside: no IPv6 (no link-local path around the rules), one address, one route
          `nsenter --net=/proc/"$3"/ns/net sh -c 'ip link set "$1" name eth0 && echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6 && ip addr add "$2" dev eth0 && ip link set eth0 up && ip route add default via "$3"' sh "$2" "$5/${SUBNET_BITS}" "$6"`,
        ].join(' && '),
        'sh',
        host,
        peer,
        String(pid),
        this.bridge,
        attachment.address,
        this.gateway,
      ]);
    } catch (error) {
      await this.detach(attachment).catch(() => undefined);
      throw error;
    }
    return attachment;
  }

  /**
   * Replaces what the sandbox may reach, in one transaction: no packet sees a half-written rule
   * set. The rules only ever see what the guard let through.
   */
  async allow(attachment: NetworkAttachment, targets: readonly EgressTarget[]): Promise<void> {
    const { index, address } = attachment;
    const now = new Set(targets.map((t) => (t.port === undefined ? t.cidr : `${t.cidr}:${t.port}`)));
    const before = this.allowed.get(index);
    const narrowing = before !== undefined && [...before].some((target) => !now.has(target));
    const emptied = this.emptied.get(index);
    // Silent since its record was last emptied, the sandbox has a new stage's record already;
    // with the same rules there is nothing to write. Silent since its flows were forgotten too,
    // it has none for a narrowing to take away (nothing outside starts a flow to a sandbox).
    const sent = await this.packetsFrom(index);
    const silent = emptied !== undefined && sent === emptied.sent;
    if (silent && !narrowing && before?.size === now.size) return;
    this.allowed.set(index, now);
    this.lastRead.delete(index);
    await nft(this.rulesScript(attachment, targets));
    this.targets.set(index, targets);
    this.relay?.permit(address, this.askable(targets));
    const flowless = silent && emptied.flowless;
    this.markEmptied(index, sent, flowless);
    await this.noteQuiet(index, sent, { destinations: [] });
    // the kernel keeps forwarding what flows the old rules let in (their replies meet no rule):
    // a rule that goes takes its flows with it, the ones still allowed start again
    if (narrowing && !flowless) await forgetFlows(address);
  }

  /**
   * Readies an attachment kept on a pooled container (no process but its agent left) for its
   * next tenant, as a new one would be: its denied counter and record zeroed, the relay's memory
   * of it gone, and no flow of the last tenant left on its address (a reply still in flight, a
   * peer's stream, which the next tenant would otherwise be handed). Its rules stay until the next
   * tenant's replace them, which costs nothing when they are the same (see {@link allow}): the
   * create of every sandbox with egress sets them. One program run: every episode's teardown.
   */
  async reset(attachment: NetworkAttachment): Promise<void> {
    const { index, address } = attachment;
    const sent = await this.packetsFrom(index);
    this.lastRead.delete(index);
    this.relay?.forget(address);
    this.relay?.permit(address, this.askable(this.targets.get(index) ?? []));
    await runProgram('sh', ['-c', `nft -f - && ${FORGET_FLOWS}`, 'sh', address], {
      input: `${this.recorderScript(attachment)}
      reset counter inet ${this.table} denied${index}`,
    });
    this.markEmptied(index, sent, true);
    // nothing refused since, while the sandbox stays silent: no listing needed to know it
    await this.noteQuiet(index, sent, { denied: 0, destinations: [] });
  }

  /**
   * Notes what the counter and record hold, known without listing them (just zeroed or emptied),
   * when the veth's packet count still stands at `sent`, read before they were.
   */
  private async noteQuiet(
    index: number,
    sent: string | undefined,
    known: Omit<QuietReading, 'sent'>,
  ): Promise<void> {
    if (sent === undefined || (await this.packetsFrom(index)) !== sent) return;
    this.lastRead.set(index, { sent, ...known });
  }

  /**
   * Notes that the attachment's record was emptied (and its flows forgotten, when `flowless`)
   * while its veth had carried `sent` packets from it; unknown when that count cannot be read.
   */
  private markEmptied(index: number, sent: string | undefined, flowless: boolean): void {
    if (sent === undefined) this.emptied.delete(index);
    else this.emptied.set(index, { sent, flowless });
  }

  /** The nft transaction that lets the sandbox reach exactly `targets` from now on. */
  private rulesScript(attachment: NetworkAttachment, targets: readonly EgressTarget[]): string {
    const { index, address } = attachment;
    const chain = `sandbox${index}`;
    const rules = targets.map(
      (t) =>
        `add rule inet ${this.table} ${chain} ip daddr ${t.cidr}${t.port === undefined ? '' : ` meta l4proto { tcp, udp } th dport ${t.port}`} accept`,
    );
    return `
      add counter inet ${this.table} denied${index}
      ${this.recorderScript(attachment)}
      add chain inet ${this.table} ${chain}
      flush chain inet ${this.table} ${chain}
      ${rules.join('\n')}
      add rule inet ${this.table} ${chain} ct state new jump record${index}
      add rule inet ${this.table} ${chain} ct state new counter name denied${index} reject with icmpx type admin-prohibited
      add rule inet ${this.table} ${chain} drop
      add element inet ${this.table} denials { ${address} : "denied${index}" }
      add element inet ${this.table} sandboxes { ${address} : jump ${chain} }`;
  }

  /**
   * A fresh record of what the sandbox is refused from now on (each new rule set is a stage): a
   * set the kernel fills, from both the guard's refusals and its own rules', with the first
   * {@link DENIED_KEPT} distinct destinations (address, protocol, port) of refused TCP and UDP
   * flows. A full set takes no more (the packet is still refused, and counted); the sandbox
   * cannot read, empty or widen it.
   */
  private recorderScript({ index, address }: NetworkAttachment): string {
    const record = `record${index}`;
    return `
      add set inet ${this.table} refused${index} { type ipv4_addr . inet_proto . inet_service; size ${DENIED_KEPT}; flags dynamic; }
      flush set inet ${this.table} refused${index}
      add chain inet ${this.table} ${record}
      flush chain inet ${this.table} ${record}
      add rule inet ${this.table} ${record} meta l4proto { tcp, udp } add @refused${index} { ip daddr . meta l4proto . th dport }
      add element inet ${this.table} recorders { ${address} : jump ${record} }`;
  }

  /**
   * The destinations the sandbox was refused since its rules were last set, as `IP:PORT/PROTO`,
   * sorted; at most {@link DENIED_KEPT}.
   */
  /** The resolvers `targets` reach that the guard does not refuse. */
  private askable(targets: readonly EgressTarget[]): string[] {
    return this.resolvers
      .filter((r) => reaches(targets, r) && !guarded(r, this.controlPlane))
      .map((r) => `${r.address}:${r.port}`);
  }

  /** Names the sandbox's resolver did not resolve for it since its rules were last set. */
  unresolvedNames(attachment: NetworkAttachment): string[] {
    return this.relay?.unresolved(attachment.address) ?? [];
  }

  async deniedDestinations(attachment: NetworkAttachment): Promise<string[]> {
    return this.unlessQuiet(attachment, 'destinations', async () =>
      destinationsOf(
        await runProgram('nft', ['-j', 'list', 'set', 'inet', this.table, `refused${attachment.index}`]),
      ),
    );
  }

  /** New connections the sandbox's rules refused so far. */
  async denied(attachment: NetworkAttachment): Promise<number> {
    return this.unlessQuiet(attachment, 'denied', async () => {
      const out = await runProgram('nft', [
        '-j',
        'list',
        'counter',
        'inet',
        this.table,
        `denied${attachment.index}`,
      ]);
      const parsed = JSON.parse(out) as { nftables?: { counter?: { packets?: number } }[] };
      return parsed.nftables?.find((entry) => entry.counter)?.counter?.packets ?? 0;
    });
  }

  /**
   * What `read` (an nft listing: a program run, the dearest part of a step's audit) last gave,
   * while the sandbox has sent no packet since: every packet the rules refuse or record crossed
   * its veth first, whose count of packets received from the sandbox then grew. A reading is
   * kept only when that count stood still from before the listing to after it, so no packet was
   * still on its way through the rules while they were listed.
   */
  private async unlessQuiet<K extends 'denied' | 'destinations'>(
    attachment: NetworkAttachment,
    kind: K,
    read: () => Promise<NonNullable<QuietReading[K]>>,
  ): Promise<NonNullable<QuietReading[K]>> {
    const { index } = attachment;
    const sent = await this.packetsFrom(index);
    const last = sent === undefined ? undefined : this.lastRead.get(index);
    const same = last !== undefined && last.sent === sent;
    const kept = same ? last[kind] : undefined;
    if (kept !== undefined) return kept;
    const value = await read();
    if (sent !== undefined && (await this.packetsFrom(index)) === sent)
      this.lastRead.set(index, { ...(same ? last : {}), sent, [kind]: value });
    return value;
  }

  /**
   * Whether the sandbox ever sent a packet on its veth: a veth that carried its traffic counts it
   * (its link's counters, which the sandbox reads and nobody can zero), so it is never handed on.
   */
  async carriedTraffic(attachment: NetworkAttachment): Promise<boolean> {
    return (await this.packetsFrom(attachment.index)) !== '0';
  }

  /** How many packets the sandbox's veth has carried from it; undefined when it cannot be read. */
  private async packetsFrom(index: number): Promise<string | undefined> {
    return readFile(`/sys/class/net/${this.hostVeth(index)}/statistics/rx_packets`, 'utf8')
      .then((text) => text.trim())
      .catch(() => undefined);
  }

  /** Removes the sandbox's veth and rules; its namespace is back to loopback only. */
  async detach(attachment: NetworkAttachment): Promise<void> {
    const { index, address } = attachment;
    await runProgram('sh', ['-c', 'ip link del "$1" 2>/dev/null || true', 'sh', this.hostVeth(index)]);
    await nft(`
      delete element inet ${this.table} sandboxes { ${address} }
      delete element inet ${this.table} denials { ${address} }
      delete element inet ${this.table} recorders { ${address} }
      delete chain inet ${this.table} sandbox${index}
      delete chain inet ${this.table} record${index}
      delete set inet ${this.table} refused${index}
      delete counter inet ${this.table} denied${index}`).catch(() => undefined);
    // the address is free again only once no flow of this sandbox is left on it: the next
    // sandbox given it would be handed the rest (replies still in flight, a peer's stream)
    await forgetFlows(address);
    this.relay?.forget(address);
    this.targets.delete(index);
    this.attached.delete(index);
    this.allowed.delete(index);
    this.lastRead.delete(index);
    this.emptied.delete(index);
  }

  get attachments(): number {
    return this.attached.size;
  }

  /** Removes the bridge, the table and the node's claim on its subnet. */
  async close(): Promise<void> {
    this.relay?.close();
    await removeNetwork(this.subnet);
    await rm(this.stateFile, { force: true });
  }

  private hostVeth(index: number): string {
    return `sgv${this.subnet}x${index}`;
  }

  private freeIndex(): number {
    for (let index = 0; index < HOSTS_PER_SUBNET; index++) if (!this.attached.has(index)) return index;
    throw new SandgymError(
      'resource_exhausted',
      `All ${HOSTS_PER_SUBNET} network addresses of this node are in use by sandboxes with egress`,
      { retryable: true },
    );
  }
}

/** An attachment's last quiet readings, and its veth's count of packets from the sandbox then. */
interface QuietReading {
  sent: string;
  denied?: number;
  destinations?: string[];
}

/** A resolver of the node's `dns` rule, which sandboxes' queries to go through the relay. */
export interface ResolverAddress {
  address: string;
  port: number;
}

/**
 * Whether the guard refuses every packet to the resolver: in {@link NEVER_REACHED}, an address of
 * this host (the guard's `fib daddr type local`), or the control plane.
 */
function guarded(resolver: ResolverAddress, plane: ControlPlane): boolean {
  const inside = (cidr: string): boolean => reaches([{ cidr }], resolver);
  const local = Object.values(networkInterfaces()).some((addresses) =>
    (addresses ?? []).some((a) => a.family === 'IPv4' && a.address === resolver.address),
  );
  return (
    local || NEVER_REACHED.some(inside) || plane.hosts.some(inside) || plane.ports.includes(resolver.port)
  );
}

/** Whether `targets` let a sandbox reach the resolver (its address, on its port). */
function reaches(targets: readonly EgressTarget[], resolver: ResolverAddress): boolean {
  return targets.some((t) => {
    const [base = '', bits = '32'] = t.cidr.split('/');
    const mask = prefixMask(Number(bits));
    return (
      (ipv4Number(resolver.address) & mask) >>> 0 === ipv4Number(base) &&
      (t.port === undefined || t.port === resolver.port)
    );
  });
}

/** How many distinct refused destinations a sandbox's record keeps per stage. */
const DENIED_KEPT = 16;

const refusedSet = z.object({
  nftables: z.array(
    z.object({
      set: z
        .object({
          elem: z
            .array(z.object({ concat: z.tuple([z.string(), z.string(), z.number()]) }))
            .max(DENIED_KEPT)
            .optional(),
        })
        .optional(),
    }),
  ),
});

/** `IP:PORT/PROTO` of each element of a listed `refused` set (`nft -j list set`). */
export function destinationsOf(listing: string): string[] {
  const parsed = refusedSet.parse(JSON.parse(listing));
  const elements = parsed.nftables.flatMap((entry) => entry.set?.elem ?? []);
  return elements.map(({ concat: [ip, proto, port] }) => `${ip}:${port}/${proto}`).sort();
}

/**
 * Removes every flow the kernel tracks to or from the address `$1` (conntrack exits 1 when
 * none, so its own words tell a failure).
 */
const FORGET_FLOWS = `for way in -s -d; do
   out=$(conntrack -D "$way" "$1" 2>&1 >/dev/null)
   case "$out" in *"flow entries have been deleted"*) ;; *) echo "$out" >&2; exit 1 ;; esac
 done`;

async function forgetFlows(address: string): Promise<void> {
  await runProgram('sh', ['-c', FORGET_FLOWS, 'sh', address]);
}

function nft(script: string): Promise<string> {
  return runProgram('nft', ['-f', '-'], { input: script });
}

/** Where each process of a data dir records the subnet it claimed. */
const NETWORKS_DIR = 'networks';

/** Removes the networks dead processes of `dataDir` left in the kernel; live ones' stay. */
export async function removeStaleNetwork(dataDir: string): Promise<void> {
  await removeStaleNetworks(dataDir);
}

/** Removes the networks of dead processes of `dataDir`; returns the subnets they had. */
async function removeStaleNetworks(dataDir: string): Promise<number[]> {
  const dir = join(dataDir, NETWORKS_DIR);
  // network.json: where a single process per data dir kept its record before
  const files = [
    join(dataDir, 'network.json'),
    ...(await readdir(dir).catch(() => [] as string[])).map((name) => join(dir, name)),
  ];
  const subnets: number[] = [];
  for (const file of files) {
    const state = await readState(file);
    if (state?.owner && (await isAlive(state.owner))) continue;
    if (state) {
      await removeNetwork(state.subnet);
      subnets.push(state.subnet);
    }
    await rm(file, { force: true });
  }
  return subnets;
}

const networkState = z.object({
  subnet: z
    .number()
    .int()
    .min(0)
    .max(SUBNETS - 1),
  owner: z.object({ pid: z.number(), startTime: z.number() }).optional(),
});

/** The subnet a node of the data dir claimed, and the process that did; undefined if unreadable. */
async function readState(stateFile: string): Promise<z.infer<typeof networkState> | undefined> {
  try {
    return networkState.parse(JSON.parse(await readFile(stateFile, 'utf8')));
  } catch {
    return undefined;
  }
}

/** What one node's network left in the kernel, gone; safe when there is nothing. */
async function removeNetwork(subnet: number): Promise<void> {
  await runProgram('sh', [
    '-c',
    // the sandboxes' veths go with their namespaces or with this loop
    `for l in $(ip -o link show master "$1" 2>/dev/null | awk -F'[:@ ]+' '{print $2}'); do ip link del "$l"; done; ` +
      `ip link del "$1" 2>/dev/null; nft delete table inet "$2" 2>/dev/null; rmdir "$3" 2>/dev/null; true`,
    'sh',
    `sgbr${subnet}`,
    `sandgym${subnet}`,
    join(CLAIMS_DIR, String(subnet)),
  ]);
}

/**
 * Takes a free subnet: `mkdir` of its claim is atomic, so two nodes starting at once never share
 * one. A claim whose bridge is gone (its node crashed and was never restarted) is taken over.
 */
async function claimSubnet(preferred: number | undefined): Promise<number> {
  await mkdir(CLAIMS_DIR, { recursive: true });
  const order = [
    ...(preferred === undefined ? [] : [preferred]),
    ...Array.from({ length: SUBNETS }, (_, i) => i),
  ];
  for (const subnet of order) {
    const claim = join(CLAIMS_DIR, String(subnet));
    try {
      await mkdir(claim);
      return subnet;
    } catch {
      const bridgeExists = await runProgram('ip', ['link', 'show', `sgbr${subnet}`]).then(
        () => true,
        () => false,
      );
      if (!bridgeExists && subnet === preferred) return subnet;
    }
  }
  throw new SandgymError('resource_exhausted', `All ${SUBNETS} sandbox subnets of this host are claimed`);
}
