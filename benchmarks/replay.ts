import { resolve } from 'node:path';
import { SandboxEnv, type SandboxAction } from '../src/env/index.ts';
import { Platform, defaultDataDir, defaultStoreDir } from '../src/platform/index.ts';
import { rm } from 'node:fs/promises';
import { compared, hostInfo, type BenchOptions, type BenchReport } from './report.ts';

const STEPS = 1000;
const ACTION: SandboxAction = { type: 'exec', command: ['true'] };

/**
 * replay: a client that crashed after 1,000 steps attaches and re-issues them. Fast-forwarding
 * them from the trajectory log is measured against executing the same 1,000 steps for real.
 */
export async function benchReplay(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-replay-${process.pid}`);
  const platform = await Platform.local({ dataDir, storeDir: defaultStoreDir(base) });
  try {
    await using env = SandboxEnv.create(platform, { sandbox: { environment: 'busybox:latest' } });
    await env.reset();
    options.progress(`replay: executing ${STEPS} logged steps`);
    let started = performance.now();
    for (let i = 0; i < STEPS; i++) await env.step(ACTION);
    const executeMs = performance.now() - started;
    options.progress(`replay: fast-forwarding the same ${STEPS} steps as a new client`);
    const attached = await SandboxEnv.attach(platform, env.current!, env.episode);
    started = performance.now();
    for (let i = 0; i < STEPS; i++) {
      const step = await attached.step(ACTION);
      if (step.info.replayed !== true) throw new Error(`step ${i} ran again instead of replaying`);
    }
    const replayMs = performance.now() - started;
    return {
      bench: 'replay',
      host: hostInfo(),
      metrics: {
        // ratio = re-execute / fast-forward: how many times faster the log is
        execute_over_replay_1000_steps: compared(executeMs, replayMs),
        replay_per_step_us: { value: Math.round((replayMs / STEPS) * 1000), unit: 'us' },
        execute_per_step_us: { value: Math.round((executeMs / STEPS) * 1000), unit: 'us' },
      },
    };
  } finally {
    await platform.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}
