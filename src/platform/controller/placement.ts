import type { BackendName } from '../../backends/index.ts';

/** What placement knows of a node: its last reported load. */
export interface NodeLoad {
  nodeId: string;
  healthy: boolean;
  /** Draining nodes are unhealthy too; this says why. */
  draining?: boolean;
  backends: readonly BackendName[];
  sandboxes: number;
  capacity: number;
  memoryCommittedMib: number;
  memoryCapacityMib: number;
}

/** What one sandbox asks of a node. */
export interface Demand {
  backend: BackendName;
  memoryMib: number;
}

interface Overlay {
  sandboxes: number;
  memoryMib: number;
}

/**
 * Power-of-k placement with an in-flight overlay. The nodes' reported loads are a stale view (a
 * watcher polls them); each placement this replica makes is added on top until the node's next
 * report includes it, so a burst does not pile onto the node that looked emptiest at the last poll.
 */
export class Placer {
  private readonly overlay = new Map<string, Overlay>();

  constructor(
    private readonly k = 2,
    private readonly random: () => number = Math.random,
  ) {}

  /** Load after this replica's own in-flight placements, as the larger of the two fill ratios. */
  load(node: NodeLoad): number {
    const extra = this.overlay.get(node.nodeId);
    const sandboxes = node.sandboxes + (extra?.sandboxes ?? 0);
    const memory = node.memoryCommittedMib + (extra?.memoryMib ?? 0);
    return Math.max(sandboxes / Math.max(1, node.capacity), memory / Math.max(1, node.memoryCapacityMib));
  }

  /** Whether the node could take the demand, as far as this replica knows. */
  fits(node: NodeLoad, demand: Demand): boolean {
    const extra = this.overlay.get(node.nodeId);
    return (
      node.healthy &&
      node.backends.includes(demand.backend) &&
      node.sandboxes + (extra?.sandboxes ?? 0) < node.capacity &&
      node.memoryCommittedMib + (extra?.memoryMib ?? 0) + demand.memoryMib <= node.memoryCapacityMib
    );
  }

  /**
   * Picks a node for the demand: the least loaded of k random nodes that fit, skipping
   * `exclude` (nodes that just refused). Undefined when no node fits.
   */
  choose(
    nodes: readonly NodeLoad[],
    demand: Demand,
    exclude: ReadonlySet<string> = new Set(),
  ): NodeLoad | undefined {
    let best: NodeLoad | undefined;
    let bestLoad = Infinity;
    let sampled = 0;
    // sample first (cheap, and the common case on a cluster with room) ...
    for (let attempt = 0; attempt < this.k * 4 && sampled < this.k; attempt++) {
      const node = nodes[Math.floor(this.random() * nodes.length)];
      if (!node || exclude.has(node.nodeId) || !this.fits(node, demand)) continue;
      sampled++;
      const load = this.load(node);
      if (load < bestLoad) [best, bestLoad] = [node, load];
    }
    if (best) return best;
    // ... and scan only when sampling found nothing: a nearly full or mostly unfit cluster
    for (const node of nodes) {
      if (exclude.has(node.nodeId) || !this.fits(node, demand)) continue;
      const load = this.load(node);
      if (load < bestLoad) [best, bestLoad] = [node, load];
    }
    return best;
  }

  /** Records a placement in flight; the returned function removes it (call once the node reports it). */
  reserve(nodeId: string, demand: Demand): () => void {
    this.adjust(nodeId, 1, demand.memoryMib);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.adjust(nodeId, -1, -demand.memoryMib);
    };
  }

  private adjust(nodeId: string, sandboxes: number, memoryMib: number): void {
    const current = this.overlay.get(nodeId) ?? { sandboxes: 0, memoryMib: 0 };
    const next = { sandboxes: current.sandboxes + sandboxes, memoryMib: current.memoryMib + memoryMib };
    if (next.sandboxes <= 0) this.overlay.delete(nodeId);
    else this.overlay.set(nodeId, next);
  }
}
