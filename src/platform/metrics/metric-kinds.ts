import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

/** Buckets for create and step latency, in seconds: from a warm-pool take to a cold VM boot. */
const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** A counter in `registry`. */
export function counter<L extends string>(
  registry: Registry,
  name: string,
  help: string,
  labelNames: L[],
): Counter<L> {
  return new Counter({ name, help, labelNames, registers: [registry] });
}

/** A latency histogram in seconds, with buckets from milliseconds to a minute. */
export function latency<L extends string>(
  registry: Registry,
  name: string,
  help: string,
  labelNames: L[],
): Histogram<L> {
  return new Histogram({ name, help, labelNames, buckets: LATENCY_BUCKETS, registers: [registry] });
}

/**
 * A gauge read at scrape time: `read` returns its samples (label values and a value); series
 * that are no longer there disappear.
 */
export function sampledGauge<L extends string>(
  registry: Registry,
  name: string,
  help: string,
  labelNames: L[],
  read: () => { labels: Partial<Record<L, string>>; value: number }[],
): void {
  new Gauge<L>({
    name,
    help,
    labelNames,
    registers: [registry],
    collect() {
      this.reset();
      for (const { labels, value } of read()) this.set(labels, value);
    },
  });
}
