import { SandgymError, type Logger } from '../../common/index.ts';
import type { NodeLoad } from './placement.ts';
import { NODE, RUNS, SANDBOXES, WireClient, type NodeStatus } from '../wire/index.ts';

interface Watched {
  address: string;
  status: NodeStatus | undefined;
  reachable: boolean;
  node: WireClient<typeof NODE>;
  sandboxes: WireClient<typeof SANDBOXES>;
  runs: WireClient<typeof RUNS>;
}

/**
 * A controller replica's view of the nodes: it polls each node agent's status, so a restarted
 * replica rebuilds everything it knows from the nodes alone. A node that stops answering is
 * marked unhealthy (no placements) and its sandboxes' calls fail with `node_lost`.
 */
export class NodeWatcher {
  private readonly watched: Watched[];
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly listeners: ((nodeId: string, polledAt: number) => void)[] = [];

  constructor(
    addresses: string[],
    token: string,
    private readonly pollMs: number,
    private readonly logger: Logger,
  ) {
    this.watched = addresses.map((address) => ({
      address,
      status: undefined,
      reachable: false,
      node: new WireClient(address, NODE, { token, unreachable: 'node_lost' }),
      sandboxes: new WireClient(address, SANDBOXES, { token, unreachable: 'node_lost' }),
      runs: new WireClient(address, RUNS, { token, unreachable: 'node_lost' }),
    }));
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
      if (!watched.reachable)
        this.logger.info({ address: watched.address, node: status.nodeId }, 'node is up');
      watched.status = status;
      watched.reachable = true;
      for (const listener of this.listeners) listener(status.nodeId, polledAt);
    } catch (error) {
      if (watched.reachable)
        this.logger.warn({ address: watched.address, err: error }, 'node stopped answering');
      watched.reachable = false;
    }
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
    const watched = this.watched.find((entry) => entry.status?.nodeId === nodeId);
    if (!watched) throw new SandgymError('not_found', `No ${what}: no node "${nodeId}" is known`);
    return watched.sandboxes;
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
    for (const watched of this.watched) {
      watched.node.close();
      watched.sandboxes.close();
      watched.runs.close();
    }
  }
}
