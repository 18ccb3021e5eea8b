import { cpus } from 'node:os';
import { resolve } from 'node:path';
import { rm } from 'node:fs/promises';
import {
  Platform,
  defaultDataDir,
  defaultStoreDir,
  type LocalPlatform,
  type Sandbox,
} from '../src/platform/index.ts';
import { hostInfo, quantile, type BenchOptions, type BenchReport } from './report.ts';

const STEPS = 300;
const WARMUP = 20;

async function stepTimes(sandbox: Sandbox): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < STEPS + WARMUP; i++) {
    const started = performance.now();
    await sandbox.exec(['true']);
    if (i >= WARMUP) times.push(performance.now() - started);
  }
  return times;
}

/** Busy-looping sandboxes of one class, as the load a latency-sensitive step competes with. */
async function withHogs<T>(
  platform: LocalPlatform,
  count: number,
  qos: 'latency' | 'best_effort',
  measure: () => Promise<T>,
): Promise<T> {
  const hogs = await Promise.all(
    Array.from({ length: count }, () => platform.createSandbox({ environment: 'busybox:latest', qos })),
  );
  try {
    for (const hog of hogs) void hog.exec(['sh', '-c', 'while :; do :; done']).catch(() => undefined);
    await new Promise((done) => setTimeout(done, 500)); // let the load settle
    return await measure();
  } finally {
    await Promise.all(hogs.map((hog) => hog.close()));
  }
}

/**
 * qos: a latency-sensitive sandbox's step (`true` through the agent) at p50 and p99, idle and
 * under best-effort load of half the cores, with the load in the best-effort class (SCHED_IDLE,
 * lowest weight) against the same load in the normal class: what QoS buys.
 */
export async function benchQos(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-qos-${process.pid}`);
  const platform = await Platform.local({ dataDir, storeDir: defaultStoreDir(base) });
  const hogs = Math.max(1, Math.floor(cpus().length / 2));
  try {
    const probe = await platform.createSandbox({ environment: 'busybox:latest', qos: 'latency' });
    try {
      options.progress(`qos: ${STEPS} steps idle`);
      const idle = await stepTimes(probe);
      options.progress(`qos: ${STEPS} steps beside ${hogs} busy sandboxes in the normal class`);
      const without = await withHogs(platform, hogs, 'latency', () => stepTimes(probe));
      options.progress(`qos: ${STEPS} steps beside ${hogs} busy best-effort sandboxes`);
      const withQos = await withHogs(platform, hogs, 'best_effort', () => stepTimes(probe));
      const round = (n: number): number => Math.round(n * 1000) / 1000;
      const metrics: BenchReport['metrics'] = {};
      for (const q of [0.5, 0.99]) {
        const name = `p${q * 100}`;
        const [calm, loaded, shielded] = [quantile(idle, q), quantile(without, q), quantile(withQos, q)];
        metrics[`step_${name}_ms_idle`] = { value: round(calm), unit: 'ms' };
        metrics[`step_${name}_ms_loaded_qos_vs_no_qos`] = {
          value: round(shielded),
          unit: 'ms',
          baseline: round(loaded),
          ratio: round(shielded / loaded),
        };
        metrics[`step_${name}_inflation_pct_with_qos`] = {
          value: Math.round((shielded / calm - 1) * 100),
          unit: '%',
        };
        metrics[`step_${name}_inflation_pct_without_qos`] = {
          value: Math.round((loaded / calm - 1) * 100),
          unit: '%',
        };
      }
      return { bench: 'qos', host: hostInfo(), metrics };
    } finally {
      await probe.close();
    }
  } finally {
    await platform.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}
