import { Registry, type Counter, type Histogram } from 'prom-client';
import { counter, latency, sampledGauge } from './metric-kinds.ts';

/** What a node agent tells Prometheus about its sandboxes. */
export interface NodeGaugeSource {
  /** Live sandboxes, by state and backend. */
  sandboxes(): { state: string; backend: string }[];
  memory(): { committedMib: number; chargedMib: number; measuredMib: number; capacityMib: number };
  draining(): boolean;
}

const MIB = 1024 * 1024;

/** A node agent's metrics, in a registry of its own (several agents may share a process in tests). */
export class NodeMetrics {
  readonly registry = new Registry();
  readonly creates: Counter<'backend' | 'outcome'>;
  readonly createSeconds: Histogram<'backend'>;
  readonly admissions: Counter<'result' | 'reason'>;
  readonly stepSeconds: Histogram<'outcome'>;

  constructor(nodeId: string, source: NodeGaugeSource) {
    const registry = this.registry;
    registry.setDefaultLabels({ node: nodeId });
    this.creates = counter(
      registry,
      'sandgym_node_creates_total',
      'Sandboxes this node was asked to make, by backend and outcome (created, failed, refused)',
      ['backend', 'outcome'],
    );
    this.createSeconds = latency(
      registry,
      'sandgym_node_create_seconds',
      'Time from an admitted create to a ready sandbox',
      ['backend'],
    );
    this.admissions = counter(
      registry,
      'sandgym_node_admissions_total',
      'Admission decisions: admitted, or refused with the reason (full, memory, quota, draining)',
      ['result', 'reason'],
    );
    this.stepSeconds = latency(
      registry,
      'sandgym_node_step_seconds',
      'Time of one Step call (actions, observation and signals), by outcome',
      ['outcome'],
    );
    sampledGauge(
      registry,
      'sandgym_node_sandboxes',
      'Live sandboxes on this node by state and backend',
      ['state', 'backend'],
      () => {
        const counts = new Map<string, { labels: { state: string; backend: string }; value: number }>();
        for (const { state, backend } of source.sandboxes()) {
          const key = `${state}/${backend}`;
          const entry = counts.get(key) ?? { labels: { state, backend }, value: 0 };
          entry.value++;
          counts.set(key, entry);
        }
        return [...counts.values()];
      },
    );
    const memory: [string, string, keyof ReturnType<NodeGaugeSource['memory']>][] = [
      ['sandgym_node_memory_committed_bytes', 'Memory the live sandboxes asked for', 'committedMib'],
      [
        'sandgym_node_memory_charged_bytes',
        'Memory admission charges them: measured use plus headroom, at most what they asked for',
        'chargedMib',
      ],
      [
        'sandgym_node_memory_measured_bytes',
        'Memory the live sandboxes were last measured to use',
        'measuredMib',
      ],
      [
        'sandgym_node_memory_capacity_bytes',
        'Memory admission may promise, overcommit included',
        'capacityMib',
      ],
    ];
    for (const [name, help, field] of memory)
      sampledGauge(registry, name, help, [], () => [{ labels: {}, value: source.memory()[field] * MIB }]);
    sampledGauge(registry, 'sandgym_node_draining', '1 while the node is draining', [], () => [
      { labels: {}, value: source.draining() ? 1 : 0 },
    ]);
  }
}
