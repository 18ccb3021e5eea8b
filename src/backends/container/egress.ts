import { readFile } from 'node:fs/promises';
import { SandgymError } from '../../common/index.ts';
import { controlPlaneOf, mergeControlPlanes, type ControlPlane } from '../host/egress-guard.ts';
import type { GroupNetwork } from '../host/group-network.ts';
import { checkHostnameRules, hostnameOfRule, resolveHostnameRules } from '../host/hostname-rules.ts';
import { checkRuleBook, parseAddress, resolveRules, type NetworkRuleBook } from '../host/network-rules.ts';
import {
  NodeNetwork,
  removeStaleNetwork,
  type NetworkAttachment,
  type ResolverAddress,
} from '../host/node-network.ts';
import { runProgram } from '../host/run-program.ts';
import type { NetworkRecord } from '../contract.ts';
import type { WarmShell } from './warm-pool.ts';

/**
 * What containers may reach beyond loopback: the node network (built when the first container
 * is given egress, removed with the backend), each container's veth on it and the rules its
 * policy names from the node's rule book, behind the network's guard, and group networks for a
 * task's services.
 */
export class ContainerEgress {
  /** The node network, built when the first sandbox is given egress. */
  private network: Promise<NodeNetwork> | undefined;
  /** Containers on the node network, by slot. */
  private readonly attached = new Map<string, Promise<NetworkAttachment>>();
  /** Containers put on a group network (until their namespace is loopback only again). */
  private readonly grouped = new Set<string>();
  /** What the guard keeps every container from beyond the fixed ranges (see {@link guard}). */
  private controlPlane: ControlPlane;

  constructor(
    private readonly dataDir: string,
    readonly ruleBook: NetworkRuleBook,
    controlPlane: readonly string[] = [],
  ) {
    checkRuleBook(ruleBook);
    this.controlPlane = controlPlaneOf(controlPlane);
  }

  /**
   * Fails on a rule name the node's rule book lacks, or a host name no sandbox may be let through
   * to, before anything starts (what a name resolves to is checked when the rules are set).
   */
  check(rules: readonly string[]): void {
    checkHostnameRules(rules);
    resolveRules(
      rules.filter((rule) => hostnameOfRule(rule) === undefined),
      this.ruleBook,
    );
  }

  /**
   * Points a container's network at the addresses `rules` name. The first rules that allow
   * anything give it a veth on the node network; later ones only rewrite its rules (an emptied
   * policy keeps the veth, so what it still tries is counted).
   */
  async set(shell: WarmShell, rules: readonly string[]): Promise<void> {
    // host names resolve now, each set: the addresses are what the rules allow, whatever the
    // sandbox's own resolver later says
    const targets = resolveRules(await resolveHostnameRules(rules), this.ruleBook);
    let attaching = this.attached.get(shell.slot);
    if (!attaching) {
      if (targets.length === 0) return;
      attaching = this.attach(shell);
    }
    const attachment = await attaching;
    await (await this.nodeNetwork()).allow(attachment, targets);
  }

  /** Gives the container a veth on the node network, nothing allowed yet. */
  private attach(shell: WarmShell): Promise<NetworkAttachment> {
    const attaching = (async () => {
      const network = await this.nodeNetwork();
      return network.attach(shell.agentPid ?? (await soleOrFirstProcess(shell)));
    })();
    this.attached.set(shell.slot, attaching);
    attaching.catch(() => this.attached.delete(shell.slot));
    return attaching;
  }

  /**
   * Adds control plane endpoints (see controlPlaneOf) the guard keeps every container from, from
   * the next packet on; a network built later starts with them.
   */
  async guard(endpoints: readonly string[]): Promise<void> {
    this.controlPlane = mergeControlPlanes(this.controlPlane, controlPlaneOf(endpoints));
    // a network that failed to open is opened afresh, with them, by the next sandbox with egress
    const network = await this.network?.catch(() => undefined);
    await network?.guard(this.controlPlane);
  }

  private nodeNetwork(): Promise<NodeNetwork> {
    if (!this.network) {
      const opening = NodeNetwork.open(this.dataDir, this.controlPlane, resolversOf(this.ruleBook));
      this.network = opening;
      opening.catch(() => (this.network = undefined));
    }
    return this.network;
  }

  /** Whether a container has a veth on the node network. */
  isAttached(slot: string): boolean {
    return this.attached.has(slot);
  }

  /**
   * Whether a container has a link beyond loopback that reaches into the node's namespace (the
   * node network, a group): a memory image's restore cannot rebuild it.
   */
  hasOuterLinks(slot: string): boolean {
    return this.attached.has(slot) || this.grouped.has(slot);
  }

  /** Packets of a container its rules dropped for want of a route. */
  async denied(slot: string): Promise<number> {
    const attachment = await this.attached.get(slot)?.catch(() => undefined);
    if (!attachment || !this.network) return 0;
    return (await this.network).denied(attachment);
  }

  /**
   * What the container's network refused since its rules were last set (a stage); undefined when
   * it is loopback only (no veth: what it tries is only counted, see deniedEgressOf).
   */
  async record(slot: string): Promise<NetworkRecord | undefined> {
    const attachment = await this.attached.get(slot)?.catch(() => undefined);
    if (!attachment || !this.network) return undefined;
    const network = await this.network;
    return {
      denied: await network.deniedDestinations(attachment),
      unresolved: network.unresolvedNames(attachment),
    };
  }

  /** Puts a container on a group network; its address there. */
  async joinGroup(shell: WarmShell, group: GroupNetwork): Promise<string> {
    this.grouped.add(shell.slot);
    return group.join(shell.agentPid ?? (await soleOrFirstProcess(shell)));
  }

  /** Takes a container off the node network: back to loopback only. */
  async detach(slot: string): Promise<void> {
    const attachment = await this.attached.get(slot)?.catch(() => undefined);
    this.attached.delete(slot);
    this.grouped.delete(slot);
    if (attachment && this.network) await (await this.network).detach(attachment);
  }

  /**
   * Puts a container's network namespace back to loopback only, for its next tenant: off the node
   * network, and every other link (a group network's `grp0`, whoever put it there, left or not)
   * deleted, the group's end of the pair with it. Fails unless loopback alone is left, so a
   * shell never goes back to the pool still on a network of its last tenant.
   */
  async isolate(shell: WarmShell): Promise<void> {
    await this.detach(shell.slot);
    await this.removeLinksBut(shell, ['lo']);
  }

  /**
   * Readies a scrubbed container's network for its next tenant. Its veth on the node network,
   * when it has one, is kept (set up again it costs a tenant more than its whole create), as new:
   * nothing allowed, its counters and record zeroed, no flow of the last tenant left (see
   * NodeNetwork.reset). Every other link (a group's) goes. Tenants hold no CAP_NET_ADMIN, so the
   * namespace itself (addresses, routes, sysctls) is as the platform set it.
   */
  async recycle(shell: WarmShell): Promise<void> {
    this.grouped.delete(shell.slot);
    // first: a socket whose process died still sends (an orphan with data queued) and holds its
    // port, and would make flows again after they are forgotten
    await this.clearSockets(shell);
    const attachment = await this.attached.get(shell.slot)?.catch(() => undefined);
    if (!attachment || !this.network) {
      this.attached.delete(shell.slot);
      return this.removeLinksBut(shell, ['lo']);
    }
    const network = await this.network;
    if (await network.carriedTraffic(attachment)) {
      // its counters hold the last tenant's traffic: a new veth, made here rather than in the
      // next tenant's create
      await this.isolate(shell);
      await this.attach(shell);
    } else {
      await network.reset(attachment);
    }
    await this.removeLinksBut(shell, ['lo', 'eth0']);
  }

  /**
   * Ends every IP socket left in the container's namespace once its processes are gone: orphans
   * still sending, TIME_WAIT holding a port. Fails (the shell is destroyed, not pooled) unless the
   * namespace then holds none, so the next tenant never meets a socket of the last.
   */
  private async clearSockets(shell: WarmShell): Promise<void> {
    const pid = shell.agentPid ?? (await soleOrFirstProcess(shell));
    if ((await socketsIn(pid)) === 0) return;
    // ss exits non-zero for a socket it cannot end; what is left decides
    await runProgram('nsenter', [`--net=/proc/${pid}/ns/net`, 'ss', '-K', '-a', '-n']).catch(() => undefined);
    const left = await socketsIn(pid);
    if (left > 0)
      throw new SandgymError(
        'platform_error',
        `Container ${shell.slot} keeps ${left} socket(s) of its last tenant, which no tenant may inherit`,
      );
  }

  /**
   * Gives a pooled container the network kind its next tenant's rules ask for: off the node
   * network when they allow nothing beyond loopback (its namespace then holds loopback only, as a
   * new container's does, and its memory can be checkpointed); a veth is added later, by the
   * first rules that allow something.
   */
  async fit(shell: WarmShell, rules: readonly string[]): Promise<void> {
    if (rules.length === 0 && this.attached.has(shell.slot)) await this.isolate(shell);
  }

  /**
   * Deletes the links of the container's namespace but `keep`, and fails unless exactly those
   * are left. The namespace's links are read from /proc (no program runs when nothing is extra).
   */
  private async removeLinksBut(shell: WarmShell, keep: readonly string[]): Promise<void> {
    const pid = shell.agentPid ?? (await soleOrFirstProcess(shell));
    let links = await linksOf(pid);
    if (links.some((link) => !keep.includes(link))) {
      await runProgram('nsenter', [
        `--net=/proc/${pid}/ns/net`,
        'sh',
        '-c',
        `for l in $(ip -o link show | awk -F'[:@ ]+' '{print $2}'); do
           case " $* " in *" $l "*) ;; *) ip link del "$l" 2>/dev/null ;; esac
         done`,
        'sh',
        ...keep,
      ]);
      links = await linksOf(pid);
    }
    if ([...links].sort().join() !== [...keep].sort().join())
      throw new SandgymError(
        'platform_error',
        `Container ${shell.slot} keeps links beyond ${keep.join(' and ')}: ${links.join(', ')}`,
      );
  }

  /** The node network goes with the last sandbox; one a crashed predecessor left goes too. */
  async close(): Promise<void> {
    if (this.network) return (await this.network).close();
    await removeStaleNetwork(this.dataDir);
  }
}

/**
 * The resolvers of the node's `dns` rule (single addresses; port 53 unless named), whose
 * queries go through the sandboxes' resolver relay.
 */
function resolversOf(book: NetworkRuleBook): ResolverAddress[] {
  return (book['dns'] ?? [])
    .map((text) => parseAddress(text, 'network rule "dns"'))
    .filter((target) => target.cidr.endsWith('/32'))
    .map((target) => ({ address: target.cidr.slice(0, -3), port: target.port ?? 53 }));
}

/**
 * The IP sockets of the network namespace `pid` is in, as /proc/PID/net/sockstat{,6} count them
 * for that namespace: those in use (an orphan still sending among them) and in TIME_WAIT. (Their
 * `orphan`, `alloc` and `mem` fields are the host's, not the namespace's.)
 */
async function socketsIn(pid: number): Promise<number> {
  let count = 0;
  for (const file of ['sockstat', 'sockstat6']) {
    const text = await readFile(`/proc/${pid}/net/${file}`, 'utf8');
    for (const match of text.matchAll(/\b(inuse|tw) (\d+)/g)) count += Number(match[2]);
  }
  return count;
}

/** The links of the network namespace `pid` is in, as /proc/PID/net/dev lists them. */
async function linksOf(pid: number): Promise<string[]> {
  const table = await readFile(`/proc/${pid}/net/dev`, 'utf8');
  return table
    .split('\n')
    .slice(2)
    .map((line) => line.split(':')[0]!.trim())
    .filter(Boolean);
}

/** A pid in the container's network namespace: its agent, found when the shell does not know it. */
async function soleOrFirstProcess(shell: WarmShell): Promise<number> {
  const [pid] = await shell.cgroup.members();
  if (pid === undefined)
    throw new SandgymError('failed_precondition', `Container ${shell.slot} has no process left`);
  return pid;
}
