import { Counter, Gauge, Histogram, Registry } from 'prom-client';

/** Buckets for create and step latency, in seconds: from a warm-pool take to a cold VM boot. */
export const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

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
    const registers = [this.registry];
    this.registry.setDefaultLabels({ node: nodeId });
    this.creates = new Counter({
      name: 'sandgym_node_creates_total',
      help: 'Sandboxes this node was asked to make, by backend and outcome (created, failed, refused)',
      labelNames: ['backend', 'outcome'],
      registers,
    });
    this.createSeconds = new Histogram({
      name: 'sandgym_node_create_seconds',
      help: 'Time from an admitted create to a ready sandbox',
      labelNames: ['backend'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.admissions = new Counter({
      name: 'sandgym_node_admissions_total',
      help: 'Admission decisions: admitted, or refused with the reason (full, memory, quota, draining)',
      labelNames: ['result', 'reason'],
      registers,
    });
    this.stepSeconds = new Histogram({
      name: 'sandgym_node_step_seconds',
      help: 'Time of one Step call (actions, observation and signals), by outcome',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    new Gauge({
      name: 'sandgym_node_sandboxes',
      help: 'Live sandboxes on this node by state and backend',
      labelNames: ['state', 'backend'],
      registers,
      collect() {
        this.reset();
        for (const { state, backend } of source.sandboxes()) this.inc({ state, backend });
      },
    });
    const memoryGauge = (name: string, help: string, read: () => number): void => {
      new Gauge({
        name,
        help,
        registers,
        collect() {
          this.set(read() * MIB);
        },
      });
    };
    memoryGauge(
      'sandgym_node_memory_committed_bytes',
      'Memory the live sandboxes asked for',
      () => source.memory().committedMib,
    );
    memoryGauge(
      'sandgym_node_memory_charged_bytes',
      'Memory admission charges them: measured use plus headroom, at most what they asked for',
      () => source.memory().chargedMib,
    );
    memoryGauge(
      'sandgym_node_memory_measured_bytes',
      'Memory the live sandboxes were last measured to use',
      () => source.memory().measuredMib,
    );
    memoryGauge(
      'sandgym_node_memory_capacity_bytes',
      'Memory admission may promise, overcommit included',
      () => source.memory().capacityMib,
    );
    new Gauge({
      name: 'sandgym_node_draining',
      help: '1 while the node is draining',
      registers,
      collect() {
        this.set(source.draining() ? 1 : 0);
      },
    });
  }
}
