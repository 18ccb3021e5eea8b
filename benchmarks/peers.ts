import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from '../src/backends/index.ts';
import type { Sandbox } from '../src/platform/index.ts';
import { BenchFixture } from './fixture.ts';
import { startDocker, startPodman, type PeerEngine } from './peer-engines.ts';
import { EVAL_SHAPES, engineEval, evalEpisodes, sandgymEval, type EvalOutcome } from './peer-eval.ts';
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
 * create→ready, `true` round trip, 100 creates 16 at a time, host memory per idle sandbox, and
 * evals of the example tasks, 20 episodes 4 at a time and 100 16 at a time (sandgym's runner
 * against a Docker harness's steps).
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
  /** Each side's outcome of each eval shape, keyed `name` then `EPISODES_at_CONCURRENCY`. */
  const evals: Record<string, Record<string, EvalOutcome>> = { sandgym: {} };
  const shapes = await Promise.all(
    EVAL_SHAPES.map(async (shape) => ({
      ...shape,
      key: `${shape.episodes}_at_${shape.concurrency}`,
      tasks: await evalEpisodes(shape.episodes),
    })),
  );
  const evalNote = (s: (typeof shapes)[number]): string =>
    `eval of ${s.episodes} example-task episodes, ${s.concurrency} at a time`;
  for (const shape of shapes) {
    options.progress(`peers: sandgym: ${evalNote(shape)}, oracle agent`);
    evals['sandgym']![shape.key] = await sandgymEval(fixture.platform, shape.tasks, shape.concurrency);
  }
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
    evals[name] = {};
    for (const shape of shapes) {
      options.progress(`peers: ${name}: ${evalNote(shape)}, as a Docker harness runs them`);
      evals[name][shape.key] = await engineEval(engine, fixture.platform, shape.tasks, shape.concurrency);
    }
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
    for (const { key } of shapes) {
      metrics[`eval_${key}_s_vs_${name}`] = compared(
        (evals['sandgym']?.[key]?.ms ?? NaN) / 1000,
        (evals[name]?.[key]?.ms ?? NaN) / 1000,
        's',
      );
    }
  }
  for (const [name, outcomes] of Object.entries(evals)) {
    for (const { key, episodes } of shapes) {
      metrics[`eval_${key}_solved_${name}`] = { value: outcomes[key]?.solved ?? 0, unit: `of ${episodes}` };
    }
  }
  return { bench: 'peers', host: hostInfo(), metrics };
}
