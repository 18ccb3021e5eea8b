import { readFileSync } from 'node:fs';
import { cpus, release, totalmem } from 'node:os';

/** One measured figure; `ratio = value / baseline` for a baseline measured in the same run. */
export interface Metric {
  value: number;
  unit: string;
  baseline?: number;
  ratio?: number;
}

/** The JSON document every benchmark writes (docs/benchmarks.md). */
export interface BenchReport {
  bench: string;
  host: { cpus: number; memoryGiB: number; kernel: string; node: string; cpuModel: string };
  metrics: Record<string, Metric>;
}

export function hostInfo(): BenchReport['host'] {
  return {
    cpus: cpus().length,
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    kernel: release(),
    node: process.version,
    cpuModel: cpus()[0]?.model ?? 'unknown',
  };
}

/** The q-quantile (0..1) of samples, nearest-rank. */
export function quantile(samples: number[], q: number): number {
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[rank] ?? Number.NaN;
}

/** A metric compared with its baseline. */
export function compared(value: number, baseline: number, unit = 'ms'): Metric {
  const round = (n: number): number => Math.round(n * 1000) / 1000;
  return { value: round(value), unit, baseline: round(baseline), ratio: round(value / baseline) };
}

/**
 * p50 and p99 of the samples, each against the same quantile of every baseline:
 * `<name>_p50_ms_vs_<baseline>` and `<name>_p99_ms_vs_<baseline>`.
 */
export function quantilesAgainst(
  name: string,
  samples: number[],
  baselines: Record<string, number[]>,
): Record<string, Metric> {
  const metrics: Record<string, Metric> = {};
  for (const q of [0.5, 0.99]) {
    for (const [baseline, times] of Object.entries(baselines)) {
      metrics[`${name}_p${q * 100}_ms_vs_${baseline}`] = compared(quantile(samples, q), quantile(times, q));
    }
  }
  return metrics;
}

/** Options every benchmark takes. */
export interface BenchOptions {
  /** Progress lines go here (stderr), so stdout stays one JSON document. */
  progress(message: string): void;
  /** `--NAME VALUE` flags of a benchmark that takes some (see BENCH_FLAGS), by NAME. */
  flags?: Record<string, string>;
}

/** Host memory in use, in KiB, as `free` counts it: neither free nor reclaimable cache. */
export function usedKib(): number {
  const info = Object.fromEntries(
    readFileSync('/proc/meminfo', 'utf8')
      .split('\n')
      .map((line) => line.split(/:\s+/))
      .map(([key, value]) => [key, Number.parseInt(value ?? '0', 10)]),
  ) as Record<string, number>;
  const reclaimable = (info['Buffers'] ?? 0) + (info['Cached'] ?? 0) + (info['SReclaimable'] ?? 0);
  return (info['MemTotal'] ?? 0) - (info['MemFree'] ?? 0) - reclaimable;
}

/** Runs `call` `count` times, `concurrency` at a time; its results, in the order they came. */
export async function atATime<T>(
  count: number,
  concurrency: number,
  call: (index: number) => Promise<T>,
): Promise<T[]> {
  const results: T[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        results.push(await call(next++));
      }
    }),
  );
  return results;
}
