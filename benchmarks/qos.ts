import { cpus } from 'node:os';
import { resolve } from 'node:path';
import { rm } from 'node:fs/promises';
import { Platform, defaultDataDir, defaultStoreDir, type Sandbox } from '../src/platform/index.ts';
import { hostInfo, quantile, type BenchOptions, type BenchReport } from './report.ts';

/**
 * Steps per block, and blocks per condition: the conditions take turns, so load from outside
 * the benchmark (these hosts are shared) falls on all three alike rather than on whichever ran
 * during it. 300 steps each, as before.
 */
const BLOCK_STEPS = 30;
const ROUNDS = 10;
const WARMUP = 20;
/** How long a hog's loop runs before the steps beside it are timed. */
const SETTLE_MS = 200;

async function stepTimes(sandbox: Sandbox, count: number): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    await sandbox.exec(['true']);
    times.push(performance.now() - started);
  }
  return times;
}

/** Busy-loops in `hogs` while `measure` runs: the load a latency-sensitive step competes with. */
async function beside<T>(hogs: Sandbox[], measure: () => Promise<T>): Promise<T> {
  const loops = hogs.map((hog) => hog.exec(['sh', '-c', 'while :; do :; done']).catch(() => undefined));
  try {
    await new Promise((done) => setTimeout(done, SETTLE_MS));
    return await measure();
  } finally {
    await Promise.all(hogs.map((hog) => hog.exec(['killall', 'sh']).catch(() => undefined)));
    await Promise.all(loops);
  }
}

/**
 * qos: a latency-sensitive sandbox's step (`true` through the agent) at p50 and p99, idle and
 * under busy load of half the cores, with the load in the best-effort class (SCHED_IDLE under an
 * idle parent cgroup) against the same load in the normal class: what QoS buys.
 */
export async function benchQos(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-qos-${process.pid}`);
  const platform = await Platform.local({ dataDir, storeDir: defaultStoreDir(base) });
  const count = Math.max(1, Math.floor(cpus().length / 2));
  const sandboxes: Sandbox[] = [];
  const create = async (qos: 'latency' | 'best_effort'): Promise<Sandbox> => {
    const sandbox = await platform.createSandbox({ environment: 'busybox:latest', qos });
    sandboxes.push(sandbox);
    return sandbox;
  };
  try {
    const probe = await create('latency');
    const normalHogs = [];
    const bestEffortHogs = [];
    for (let i = 0; i < count; i++) {
      normalHogs.push(await create('latency'));
      bestEffortHogs.push(await create('best_effort'));
    }
    await stepTimes(probe, WARMUP);
    const idle: number[] = [];
    const without: number[] = [];
    const withQos: number[] = [];
    options.progress(
      `qos: ${ROUNDS} rounds of ${BLOCK_STEPS} steps each idle, beside ${count} busy normal-class sandboxes, beside ${count} busy best-effort ones`,
    );
    for (let round = 0; round < ROUNDS; round++) {
      idle.push(...(await stepTimes(probe, BLOCK_STEPS)));
      without.push(...(await beside(normalHogs, () => stepTimes(probe, BLOCK_STEPS))));
      withQos.push(...(await beside(bestEffortHogs, () => stepTimes(probe, BLOCK_STEPS))));
    }
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
      metrics[`step_${name}_ms_loaded_qos_vs_idle`] = {
        value: round(shielded),
        unit: 'ms',
        baseline: round(calm),
        ratio: round(shielded / calm),
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
    await Promise.all(sandboxes.map((sandbox) => sandbox.close().catch(() => undefined)));
    await platform.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}
