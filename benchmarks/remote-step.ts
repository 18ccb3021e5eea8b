import { resolve } from 'node:path';
import { rm } from 'node:fs/promises';
import { SandboxEnv, type SandboxAction } from '../src/env/index.ts';
import { Platform, defaultDataDir, defaultStoreDir, type PlatformClient } from '../src/platform/index.ts';
import { startBenchNode } from './node-process.ts';
import { quantile, type BenchOptions, type BenchReport, hostInfo } from './report.ts';

const STEPS = 300;
const WARMUP = 20;
const ACTION: SandboxAction = { type: 'exec', command: ['true'] };

async function stepTimes(platform: PlatformClient): Promise<number[]> {
  await using env = SandboxEnv.create(platform, { sandbox: { environment: 'busybox:latest' } });
  await env.reset();
  const times: number[] = [];
  for (let i = 0; i < STEPS + WARMUP; i++) {
    const started = performance.now();
    await env.step(ACTION);
    if (i >= WARMUP) times.push(performance.now() - started);
  }
  return times;
}

/**
 * remote-step: an env step (an exec, logged exactly once) through gRPC to a node agent in its own
 * process, against the same step on the embedded platform. The goal is at most +1 ms at p50.
 */
export async function benchRemoteStep(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-remote-step-${process.pid}`);
  const local = await Platform.local({ dataDir, storeDir: defaultStoreDir(base) });
  let localTimes: number[];
  try {
    options.progress(`remote-step: ${STEPS} steps on the embedded platform`);
    localTimes = await stepTimes(local);
  } finally {
    await local.close();
    await rm(dataDir, { recursive: true, force: true });
  }
  await using node = await startBenchNode();
  const remote = await Platform.connect(node.url, { token: node.token });
  let remoteTimes: number[];
  const roundTrips: number[] = [];
  try {
    options.progress(`remote-step: ${STEPS} steps through gRPC to a node agent`);
    remoteTimes = await stepTimes(remote);
    // the floor under every call: one round trip that does nearly nothing on the node (a step
    // lookup in an empty episode). A new step costs two of them: the command, then its log record.
    const sandbox = await remote.createSandbox({ environment: 'busybox:latest' });
    const log = await remote.stepLog(sandbox.id);
    for (let i = 0; i < STEPS + WARMUP; i++) {
      const started = performance.now();
      await log.lookup({ episodeId: 'floor', stepIndex: 0, action: {} });
      if (i >= WARMUP) roundTrips.push(performance.now() - started);
    }
    await sandbox.close();
  } finally {
    await remote.close();
  }
  const round = (n: number): number => Math.round(n * 1000) / 1000;
  const metrics: BenchReport['metrics'] = {};
  for (const q of [0.5, 0.99]) {
    const value = quantile(remoteTimes, q);
    const baseline = quantile(localTimes, q);
    metrics[`step_p${q * 100}_ms_remote_vs_local`] = {
      value: round(value),
      unit: 'ms',
      baseline: round(baseline),
      ratio: round(value / baseline),
    };
    metrics[`step_p${q * 100}_added_ms`] = { value: round(value - baseline), unit: 'ms' };
  }
  metrics['rpc_round_trip_p50_ms'] = { value: round(quantile(roundTrips, 0.5)), unit: 'ms' };
  return { bench: 'remote-step', host: hostInfo(), metrics };
}
