import { resolve } from 'node:path';
import { rm } from 'node:fs/promises';
import { SandboxEnv, type SandboxAction } from '../src/env/index.ts';
import { Platform, defaultDataDir, defaultStoreDir, type PlatformClient } from '../src/platform/index.ts';
import { startBenchNode } from './node-process.ts';
import { pythonConcurrentSteps, pythonStepTimes } from './python-client.ts';
import { atATime, compared, quantile, type BenchOptions, type BenchReport, hostInfo } from './report.ts';

const STEPS = 300;
const WARMUP = 20;
const ACTION: SandboxAction = { type: 'exec', command: ['true'] };
/** Envs stepping at once from one client process, as a trainer's rollout workers do. */
const CONCURRENT_ENVS = 1000;
const CONCURRENT_ROUNDS = 5;
/** Envs reset at once: each reset makes a sandbox, which the node admits a few at a time. */
const RESET_BATCH = 50;
/** Small sandboxes, so a thousand fit on one node (python/examples/bench_aio.py uses the same). */
const SMALL_SANDBOX = { environment: 'busybox:latest', resources: { memoryMib: 16 } };

/** Times `call` STEPS times after a warm-up. */
async function timed(call: () => Promise<unknown>): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < STEPS + WARMUP; i++) {
    const started = performance.now();
    await call();
    if (i >= WARMUP) times.push(performance.now() - started);
  }
  return times;
}

interface Side {
  exec: number[];
  step: number[];
  /** A call that does nearly nothing where the sandbox runs (Describe): the transport's floor. */
  floor: number[];
}

/** Bare execs of `true`, then env steps of the same command, then the floor, on one platform. */
async function measure(platform: PlatformClient): Promise<Side> {
  const sandbox = await platform.createSandbox({ environment: 'busybox:latest' });
  try {
    const exec = await timed(() => sandbox.exec(['true']));
    const floor = await timed(() => platform.attachSandbox(sandbox.id));
    await using env = SandboxEnv.create(platform, { sandbox: { environment: 'busybox:latest' } });
    await env.reset();
    const step = await timed(() => env.step(ACTION));
    return { exec, step, floor };
  } finally {
    await sandbox.close();
  }
}

/**
 * Steps per second of CONCURRENT_ENVS envs on one client, each round stepping every env once,
 * all in flight together (the TypeScript side of python/examples/bench_aio.py).
 */
async function concurrentStepsPerSecond(platform: PlatformClient): Promise<number> {
  const envs = Array.from({ length: CONCURRENT_ENVS }, () =>
    SandboxEnv.create(platform, { sandbox: SMALL_SANDBOX }),
  );
  try {
    await atATime(envs.length, RESET_BATCH, (i) => envs[i]!.reset());
    await Promise.all(envs.map((env) => env.step(ACTION))); // warm-up round
    const started = performance.now();
    for (let round = 0; round < CONCURRENT_ROUNDS; round++) {
      const results = await Promise.all(envs.map((env) => env.step(ACTION)));
      const failed = results.find((r) => r.outcome.kind !== 'ok');
      if (failed) throw new Error(`remote-step: a concurrent step failed: ${JSON.stringify(failed.outcome)}`);
    }
    return (CONCURRENT_ENVS * CONCURRENT_ROUNDS) / ((performance.now() - started) / 1000);
  } finally {
    await atATime(envs.length, RESET_BATCH, (i) => envs[i]!.close());
  }
}

/**
 * remote-step: an env step of `true` (one call: run, audited and logged exactly once where the
 * sandbox runs) against the bare exec under it, on the embedded platform and through gRPC to a
 * node agent in its own process, and the same steps from the Python client. Goals: a step at most
 * 1.5x the exec and 3 ms at p50; remote at most local plus one round trip; Python at most the
 * TypeScript client plus 0.5 ms. Then CONCURRENT_ENVS envs stepping at once through the node:
 * steps per second from Python's asyncio client (sandgym.aio) against the TypeScript client's.
 */
export async function benchRemoteStep(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-remote-step-${process.pid}`);
  const local = await Platform.local({ dataDir, storeDir: defaultStoreDir(base) });
  let embedded: Side;
  try {
    options.progress(`remote-step: ${STEPS} execs and steps on the embedded platform`);
    embedded = await measure(local);
  } finally {
    await local.close();
    await rm(dataDir, { recursive: true, force: true });
  }
  await using node = await startBenchNode(['--max-sandboxes', String(CONCURRENT_ENVS + 100)]);
  const client = await Platform.connect(node.url, { token: node.token });
  let remote: Side;
  let concurrent: number;
  try {
    options.progress(`remote-step: ${STEPS} execs and steps through gRPC to a node agent`);
    remote = await measure(client);
    options.progress(`remote-step: ${CONCURRENT_ENVS} envs stepping at once from the TypeScript client`);
    concurrent = await concurrentStepsPerSecond(client);
  } finally {
    await client.close();
  }
  options.progress(`remote-step: ${STEPS} steps from the Python client`);
  const python = await pythonStepTimes(node.url, node.token, STEPS, WARMUP);
  options.progress(`remote-step: ${CONCURRENT_ENVS} envs stepping at once from Python's asyncio client`);
  const pythonConcurrent = await pythonConcurrentSteps(
    node.url,
    node.token,
    CONCURRENT_ENVS,
    CONCURRENT_ROUNDS,
  );
  const p50 = (samples: number[]): number => quantile(samples, 0.5);
  const metrics: BenchReport['metrics'] = {
    local_step_p50_vs_exec: compared(p50(embedded.step), p50(embedded.exec)),
    local_step_p99_vs_exec: compared(quantile(embedded.step, 0.99), quantile(embedded.exec, 0.99)),
    remote_step_p50_vs_exec: compared(p50(remote.step), p50(remote.exec)),
    remote_step_p50_vs_local: compared(p50(remote.step), p50(embedded.step)),
    // what going remote adds to a step, against one round trip that does nearly nothing
    remote_step_added_p50_vs_round_trip: compared(p50(remote.step) - p50(embedded.step), p50(remote.floor)),
  };
  if (python) metrics['python_step_p50_vs_typescript'] = compared(p50(python), p50(remote.step));
  if (pythonConcurrent)
    metrics[`python_aio_${CONCURRENT_ENVS}_envs_steps_per_s_vs_typescript`] = compared(
      pythonConcurrent.stepsPerSecond,
      concurrent,
      'steps/s',
    );
  return { bench: 'remote-step', host: hostInfo(), metrics };
}
