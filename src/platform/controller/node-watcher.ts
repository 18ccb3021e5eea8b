import { SandgymError, isSandgymError, type Logger } from '../../common/index.ts';
import type { NodeLoad } from './placement.ts';
import {
  ENVS,
  NODE,
  RUNS,
  SANDBOXES,
  WireClient,
  tlsMismatch,
  type NodeStatus,
  type TlsFiles,
} from '../wire/index.ts';

interface Watched {
  address: string;
  /** The id etcd registered it under; polled statuses must agree. */
  registeredAs: string | undefined;
  status: NodeStatus | undefined;
  reachable: boolean;
  /** Whether its failure to answer was looked into since it last answered (see tlsMismatch). */
  diagnosed: boolean;
  node: WireClient<typeof NODE>;
  sandboxes: WireClient<typeof SANDBOXES>;
  runs: WireClient<typeof RUNS>;
  envs: WireClient<typeof ENVS>;
}

/**
 * A controller replica's view of the nodes: it polls each node agent's status, so a restarted
 * replica rebuilds everything it knows from the nodes alone. A node that stops answering is
 * marked unhealthy (no placements) and its sandboxes' calls fail with `node_lost`. The nodes are
 * a fixed list, or come and go as etcd membership says ({@link join}, {@link leave}).
 */
export class NodeWatcher {
  private readonly watched: Watched[] = [];
  /** Nodes that left the cluster, so their sandboxes' calls say so rather than "unknown". */
  private readonly departed = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly listeners: ((nodeId: string, polledAt: number) => void)[] = [];

  constructor(
    addresses: string[],
    private readonly connection: { token: string; tls?: TlsFiles | undefined },
    private readonly pollMs: number,
    private readonly logger: Logger,
  ) {
    for (const address of addresses) this.watched.push(this.watch(address, undefined));
  }

  private watch(address: string, registeredAs: string | undefined): Watched {
    const options = {
      token: this.connection.token,
      unreachable: 'node_lost' as const,
      ...(this.connection.tls ? { tls: this.connection.tls } : {}),
    };
    return {
      address,
      registeredAs,
      status: undefined,
      reachable: false,
      diagnosed: false,
      node: new WireClient(address, NODE, options),
      sandboxes: new WireClient(address, SANDBOXES, options),
      runs: new WireClient(address, RUNS, options),
      envs: new WireClient(address, ENVS, options),
    };
  }

  /** A node etcd says is a member (again, or with a new address): watched, and polled at once. */
  join(nodeId: string, address: string): void {
    this.departed.delete(nodeId);
    let watched = this.watched.find((entry) => entry.registeredAs === nodeId);
    if (watched && watched.address !== address) {
      this.unwatch(watched);
      watched = undefined;
    }
    if (!watched) {
      watched = this.watch(address, nodeId);
      this.watched.push(watched);
      this.logger.info({ node: nodeId, address }, 'node joined');
    }
    // a changed record (draining, say) shows in the node's status: look now, not at the next tick
    void this.poll(watched);
  }

  /** A node whose etcd lease is gone: no placements, and its sandboxes' calls fail `node_lost`. */
  leave(nodeId: string): void {
    const watched = this.watched.find((entry) => entry.registeredAs === nodeId);
    if (!watched) return;
    this.unwatch(watched);
    this.departed.add(nodeId);
    this.logger.warn({ node: nodeId }, 'node left the cluster (its etcd lease ended)');
  }

  private unwatch(watched: Watched): void {
    this.watched.splice(this.watched.indexOf(watched), 1);
    watched.node.close();
    watched.sandboxes.close();
    watched.runs.close();
    watched.envs.close();
  }

  /** Polls once (so the first view is complete), then keeps polling. */
  async start(): Promise<void> {
    await this.pollAll();
    const tick = (): void => {
      if (this.closed) return;
      this.timer = setTimeout(() => void this.pollAll().finally(tick), this.pollMs);
    };
    tick();
  }

  /** Called after each successful poll of a node, with when that poll started. */
  onPolled(listener: (nodeId: string, polledAt: number) => void): void {
    this.listeners.push(listener);
  }

  private async pollAll(): Promise<void> {
    await Promise.all(this.watched.map((watched) => this.poll(watched)));
  }

  private async poll(watched: Watched): Promise<void> {
    const polledAt = Date.now();
    try {
      const status = await watched.node.call('Status', {}, { timeoutMs: Math.max(1000, this.pollMs * 2) });
      if (!this.watched.includes(watched)) return;
      if (watched.registeredAs !== undefined && status.nodeId !== watched.registeredAs) {
        throw new SandgymError(
          'failed_precondition',
          `${watched.address} answers as node ${status.nodeId}, but etcd registered it as ${watched.registeredAs}`,
        );
      }
      if (!watched.reachable)
        this.logger.info({ address: watched.address, node: status.nodeId }, 'node is up');
      watched.status = status;
      watched.reachable = true;
      watched.diagnosed = false;
      for (const listener of this.listeners) listener(status.nodeId, polledAt);
    } catch (error) {
      if (watched.reachable)
        this.logger.warn({ address: watched.address, err: error }, 'node stopped answering');
      watched.reachable = false;
      if (isSandgymError(error, 'node_lost')) this.diagnose(watched);
    }
  }

  /**
   * Logs why a node refuses this controller's connections when their TLS does not match (the
   * node has TLS and the controller none, say): no poll would ever reach it, and otherwise the
   * only sign would be creates that find no node.
   */
  private diagnose(watched: Watched): void {
    if (watched.diagnosed) return;
    watched.diagnosed = true;
    void tlsMismatch(watched.address, this.connection.tls).then((cause) => {
      if (cause && this.watched.includes(watched))
        this.logger.error({ address: watched.address, cause }, 'node refuses this controller: TLS mismatch');
    });
  }

  /** Every node seen so far, with its last load; unreachable ones are unhealthy. */
  loads(): NodeLoad[] {
    const loads: NodeLoad[] = [];
    for (const { status, reachable } of this.watched) {
      if (status) loads.push({ ...status, healthy: reachable && status.healthy });
    }
    return loads;
  }

  /** Live sandboxes of a project across the nodes, as last reported. */
  projectCount(project: string): number {
    let total = 0;
    for (const { status } of this.watched) total += status?.projects[project] ?? 0;
    return total;
  }

  /** The client for a node's sandboxes. An unknown node is `not_found`, like an unknown sandbox. */
  clientOf(nodeId: string, what: string): WireClient<typeof SANDBOXES> {
    return this.watchedOf(nodeId, what).sandboxes;
  }

  /** The client for the envs a node serves. An unknown node is `not_found`, like an unknown env. */
  envClientOf(nodeId: string, what: string): WireClient<typeof ENVS> {
    return this.watchedOf(nodeId, what).envs;
  }

  private watchedOf(nodeId: string, what: string): Watched {
    const watched = this.watched.find((entry) => entry.status?.nodeId === nodeId);
    if (!watched && this.departed.has(nodeId)) {
      throw new SandgymError('node_lost', `Node ${nodeId} left the cluster: its etcd lease ended`, {
        retryable: true,
      });
    }
    if (!watched) throw new SandgymError('not_found', `No ${what}: no node "${nodeId}" is known`);
    return watched;
  }

  /** Run clients of every node that answered its last poll. */
  reachableRunClients(): WireClient<typeof RUNS>[] {
    return this.watched.filter((entry) => entry.reachable).map((entry) => entry.runs);
  }

  /** Clients of every node that answered its last poll. */
  reachableClients(): WireClient<typeof SANDBOXES>[] {
    return this.watched.filter((entry) => entry.reachable).map((entry) => entry.sandboxes);
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    for (const watched of [...this.watched]) this.unwatch(watched);
  }
}
