import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { LATENCY_BUCKETS } from './node-metrics.ts';

/** What a controller replica tells Prometheus at scrape time. */
export interface ControllerGaugeSource {
  /** Creates waiting for room, per project. */
  queueDepths(): Map<string, number>;
  /** Nodes it knows, by state. */
  nodes(): { healthy: number; unhealthy: number; draining: number };
}

/** A controller replica's metrics, in a registry of its own. */
export class ControllerMetrics {
  readonly registry = new Registry();
  readonly creates: Counter<'project' | 'outcome'>;
  readonly createSeconds: Histogram<'outcome'>;
  readonly admissions: Counter<'project' | 'result' | 'reason'>;

  constructor(source: ControllerGaugeSource) {
    const registers = [this.registry];
    this.creates = new Counter({
      name: 'sandgym_controller_creates_total',
      help: 'Creates this replica handled, by project and outcome (created, refused, failed)',
      labelNames: ['project', 'outcome'],
      registers,
    });
    this.createSeconds = new Histogram({
      name: 'sandgym_controller_create_seconds',
      help: 'Time of a create through this replica, waiting in the queue included',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers,
    });
    this.admissions = new Counter({
      name: 'sandgym_controller_admissions_total',
      help: 'Admission decisions: admitted, or refused with the reason (quota, never_fits, queue_timeout)',
      labelNames: ['project', 'result', 'reason'],
      registers,
    });
    new Gauge({
      name: 'sandgym_controller_queue_depth',
      help: 'Creates waiting for room, per project',
      labelNames: ['project'],
      registers,
      collect() {
        this.reset();
        for (const [project, depth] of source.queueDepths()) this.set({ project }, depth);
      },
    });
    new Gauge({
      name: 'sandgym_controller_nodes',
      help: 'Nodes this replica knows, by state',
      labelNames: ['state'],
      registers,
      collect() {
        for (const [state, count] of Object.entries(source.nodes())) this.set({ state }, count);
      },
    });
  }
}
