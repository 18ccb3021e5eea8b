import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from '../src/backends/index.ts';
import type { Sandbox } from '../src/platform/index.ts';
import { BenchFixture } from './fixture.ts';
import { startDocker, startPodman, type PeerEngine } from './peer-engines.ts';
import { EVAL_EPISODES, engineEval, evalEpisodes, sandgymEval, type EvalOutcome } from './peer-eval.ts';
import {
  atATime,
  compared,
  hostInfo,
  quantile,
  usedKib,
  type BenchOptions,
  type BenchReport,
  type Metric,
} from './report.ts';

const CREATES = 30;
const EXECS = 200;
const BURST = 100;
const CONCURRENCY = 16;
const IDLE = 200;
const WARMUP = 3;
const IMAGE = 'sandgym-bench/busybox:latest';

/** What one system did, the same work on each. */
interface Side {
  createMs: number[];
  execMs: number[];
  burstMs: number;
  idleKib: number;
}

/** The operations each side offers the benchmark. */
interface Driver {
  create(): Promise<{ exec(): Promise<void>; close(): Promise<void> }>;
}

/** Host memory in use once the host has settled: the median of three readings a second apart. */
async function settledUsedKib(): Promise<number> {
  await new Promise((resolve) => setTimeout(resolve, 5_000));
  const readings: number[] = [];
  for (let i = 0; i < 3; i++) {
    readings.push(usedKib());
    await new Promise((resolve) => setTimeout(resolve, 1_000));
  }
  return quantile(readings, 0.5);
}

/** Runs the same work through one system. */
async function measure(name: string, driver: Driver, options: BenchOptions): Promise<Side> {
  options.progress(`peers: ${name}: ${CREATES} creates, ${EXECS} execs`);
  const createMs: number[] = [];
  for (let i = 0; i < CREATES + WARMUP; i++) {
    const started = performance.now();
    const box = await driver.create();
    if (i >= WARMUP) createMs.push(performance.now() - started);
    await box.close();
  }
  const box = await driver.create();
  const execMs: number[] = [];
  for (let i = 0; i < EXECS + WARMUP; i++) {
    const started = performance.now();
    await box.exec();
    if (i >= WARMUP) execMs.push(performance.now() - started);
  }
  await box.close();

  options.progress(`peers: ${name}: ${BURST} creates, ${CONCURRENCY} at a time`);
  const started = performance.now();
  const burst = await atATime(BURST, CONCURRENCY, () => driver.create());
  const burstMs = performance.now() - started;
  await Promise.all(burst.map((b) => b.close()));

  options.progress(`peers: ${name}: memory of ${IDLE} idle sandboxes`);
  const before = await settledUsedKib();
  const idle: { close(): Promise<void> }[] = [];
  for (let i = 0; i < IDLE; i++) idle.push(await driver.create());
  const idleKib = ((await settledUsedKib()) - before) / IDLE;
  await Promise.all(idle.map((b) => b.close()));
  return { createMs, execMs, burstMs, idleKib };
}

function engineDriver(engine: PeerEngine): Driver {
  return {
    async create() {
      const id = await engine.api.run(IMAGE);
      return {
        exec: async () => {
          const code = await engine.api.exec(id, ['/bin/true']);
          if (code !== 0) throw new Error(`${engine.api.name} exec of true exited ${code}`);
        },
        close: () => engine.api.remove(id),
      };
    },
  };
}

/**
 * peers: the same work through sandgym (embedded, cold creates) and through Debian's Docker
 * (`docker.io`) and Podman, each driven through its API socket as an SDK would, in one run:
 * create→ready, `true` round trip, 100 creates 16 at a time, host memory per idle sandbox, and a
 * 20-episode eval of the example tasks (sandgym's runner against a Docker harness's steps).
 * The engines run in folders of their own, without iptables or a bridge, and everything they
 * made is removed at the end.
 */
export async function benchPeers(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create({}, 'peers');
  const sandgym = await measure(
    'sandgym',
    {
      async create() {
        const sandbox: Sandbox = await fixture.platform.createSandbox({ environment: 'busybox:latest' });
        return {
          exec: async () => void (await sandbox.exec(['true'])),
          close: () => sandbox.close(),
        };
      },
    },
    options,
  );
  const episodes = await evalEpisodes();
  options.progress(`peers: sandgym: eval of ${episodes.length} example-task episodes, oracle agent`);
  const evals: Record<string, EvalOutcome> = { sandgym: await sandgymEval(fixture.platform, episodes) };
  const tarFile = join(fixture.dir, 'busybox.tar');
  await runProgram('tar', ['-C', fixture.rootfs, '-cf', tarFile, '.']);
  const tar = await readFile(tarFile);
  const peers: Record<string, Side> = {};
  for (const [name, start] of [
    ['docker', startDocker],
    ['podman', startPodman],
  ] as const) {
    options.progress(`peers: starting ${name} in a folder of its own`);
    await using engine = await start(join(fixture.dir, name));
    await engine.api.importImage(tar, 'sandgym-bench/busybox', 'latest');
    peers[name] = await measure(name, engineDriver(engine), options);
    options.progress(
      `peers: ${name}: eval of ${episodes.length} example-task episodes, as a Docker harness runs them`,
    );
    evals[name] = await engineEval(engine, fixture.platform, episodes);
  }
  const p50 = (samples: number[]): number => quantile(samples, 0.5);
  const perSecond = (ms: number): number => (BURST / ms) * 1000;
  const metrics: Record<string, Metric> = {};
  for (const [name, side] of Object.entries(peers)) {
    metrics[`create_p50_vs_${name}`] = compared(p50(sandgym.createMs), p50(side.createMs));
    metrics[`exec_p50_vs_${name}`] = compared(p50(sandgym.execMs), p50(side.execMs));
    metrics[`burst_per_s_vs_${name}`] = compared(
      perSecond(sandgym.burstMs),
      perSecond(side.burstMs),
      'sandboxes/s',
    );
    metrics[`idle_memory_vs_${name}`] = compared(sandgym.idleKib / 1024, side.idleKib / 1024, 'MiB');
    metrics[`eval_${EVAL_EPISODES}_episodes_s_vs_${name}`] = compared(
      (evals['sandgym']?.ms ?? NaN) / 1000,
      (evals[name]?.ms ?? NaN) / 1000,
      's',
    );
  }
  for (const [name, outcome] of Object.entries(evals)) {
    metrics[`eval_solved_${name}`] = { value: outcome.solved, unit: `of ${EVAL_EPISODES}` };
  }
  return { bench: 'peers', host: hostInfo(), metrics };
}
