import { Registry, type Counter, type Histogram } from 'prom-client';
import { counter, latency, sampledGauge } from './metric-kinds.ts';

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
    const registry = this.registry;
    this.creates = counter(
      registry,
      'sandgym_controller_creates_total',
      'Creates this replica handled, by project and outcome (created, refused, failed)',
      ['project', 'outcome'],
    );
    this.createSeconds = latency(
      registry,
      'sandgym_controller_create_seconds',
      'Time of a create through this replica, waiting in the queue included',
      ['outcome'],
    );
    this.admissions = counter(
      registry,
      'sandgym_controller_admissions_total',
      'Admission decisions: admitted, or refused with the reason (quota, never_fits, queue_timeout)',
      ['project', 'result', 'reason'],
    );
    sampledGauge(
      registry,
      'sandgym_controller_queue_depth',
      'Creates waiting for room, per project',
      ['project'],
      () => [...source.queueDepths()].map(([project, value]) => ({ labels: { project }, value })),
    );
    sampledGauge(registry, 'sandgym_controller_nodes', 'Nodes this replica knows, by state', ['state'], () =>
      Object.entries(source.nodes()).map(([state, value]) => ({ labels: { state }, value })),
    );
  }
}
