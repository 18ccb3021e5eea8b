import { createHash } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { agentBinaryPath } from '../../src/backends/index.ts';
import { SandboxEnv, PROTECTED_PATHS, type StepSignals } from '../../src/env/index.ts';
import { buildLayerFromTar, type Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';
import { ATTACKS, type Attack, type AttackResult } from './attacks.ts';
import { attack } from './summary.ts';

/** What must be the same on the host before and after every attack. */
function hostFingerprint(): Record<string, string> {
  const digest = (path: string): string => createHash('sha256').update(readFileSync(path)).digest('hex');
  const ours = /sandgym|\/run\/netns|\/tmp\//;
  return {
    hostname: hostname(),
    sysrq: existsSync('/proc/sys/kernel/sysrq')
      ? readFileSync('/proc/sys/kernel/sysrq', 'utf8').trim()
      : 'absent',
    binSh: digest('/bin/sh'),
    usrBinEnv: digest('/usr/bin/env'),
    agent: digest(agentBinaryPath()),
    mounts: readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .filter((line) => line && !ours.test(line))
      .map((line) => line.split(' ')[4])
      .sort()
      .join(' '),
  };
}

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0;
}

/** A neighbour's step latency while `during` runs: it steps (a command) back to back. */
async function probeWhile<T>(
  neighbour: Sandbox,
  during: Promise<T>,
): Promise<{ value: T; latencies: number[] }> {
  const latencies: number[] = [];
  let done = false;
  const probing = (async () => {
    while (!done) {
      const started = performance.now();
      const result = await neighbour.exec(['echo', 'neighbour']);
      expect(result.stdout).toBe('neighbour\n');
      latencies.push(performance.now() - started);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  })();
  try {
    return { value: await during, latencies };
  } finally {
    done = true;
    await probing;
  }
}

describe('hostile suite', () => {
  let env: TestPlatform;
  let upstream: Upstream;
  let listener: Server;
  let hostPort = 0;
  let neighbour: Sandbox;
  let fingerprint: Record<string, string>;
  const baseline: number[] = [];
  const during: number[] = [];
  const contained: string[] = [];

  beforeAll(async () => {
    upstream = await startUpstream(2, [8080]);
    env = await createTestPlatform('hostile', {
      privateStore: true,
      seed: ['debian:bookworm'],
      networkRules: { 'mirror:test': [`${upstream.address}:8080`] },
    });
    listener = createServer((socket) => socket.end('node secret\n'));
    await new Promise<void>((resolve) => listener.listen(0, '0.0.0.0', resolve));
    hostPort = (listener.address() as { port: number }).port;
    neighbour = await env.platform.createSandbox({ environment: 'busybox:latest' });
    for (let i = 0; i < 100; i++) {
      const started = performance.now();
      await neighbour.exec(['echo', 'neighbour']);
      baseline.push(performance.now() - started);
    }
    fingerprint = hostFingerprint();
  });

  afterAll(async () => {
    const p99 = (values: number[]): string => `${percentile(values, 99).toFixed(1)} ms`;
    console.log(
      `hostile suite: ${ATTACKS.length} attacks run, ${contained.length} contained; neighbour step p99 ${p99(during)} during attacks (${during.length} steps) against ${p99(baseline)} at rest (${baseline.length} steps)`,
    );
    listener?.close();
    try {
      await neighbour?.close();
      await env?.[Symbol.asyncDispose]();
    } finally {
      // the upstream's namespace goes even when the platform's teardown finds something wrong
      await upstream?.[Symbol.asyncDispose]();
    }
  });

  it('has at least 30 attacks of every kind the issue lists', () => {
    expect(ATTACKS.length).toBeGreaterThanOrEqual(30);
    for (const kind of ['resource', 'escape', 'platform', 'network'] as const) {
      expect(ATTACKS.filter((a) => a.kind === kind).length, kind).toBeGreaterThanOrEqual(3);
    }
  });

  async function runAttack(attack: Attack): Promise<void> {
    const gym = SandboxEnv.create(env.platform, {
      sandbox: { environment: 'busybox:latest', ...attack.request },
      protectedPaths: PROTECTED_PATHS,
    });
    try {
      await gym.reset();
      const sandbox = gym.current!;
      const script =
        typeof attack.script === 'string'
          ? attack.script
          : attack.script({ upstream: upstream.address, hostPort });
      const { value: step, latencies } = await probeWhile(
        neighbour,
        gym.step({ type: 'exec', command: ['sh', '-c', script], timeoutMs: attack.timeoutMs ?? 15_000 }),
      );
      during.push(...latencies);
      expect(step.outcome).toEqual({ kind: 'ok' });
      const observation = step.observation;
      if (observation.type !== 'exec')
        throw new Error(`expected an exec observation, got ${observation.type}`);
      const signals = step.info.signals as StepSignals;
      expect(signals, JSON.stringify(step.info)).toHaveProperty('limitsHit');
      const result: AttackResult = { ...observation, signals };
      await attack.contained(result, {
        sandbox,
        upstream: upstream.address,
        hostPort,
        ingestTar: async (archive) => {
          const path = join(env.dataDir, `upload-${Date.now()}.tar`);
          writeFileSync(path, archive);
          try {
            return await buildLayerFromTar(env.platform.store, path);
          } finally {
            await rm(path, { force: true });
          }
        },
      });
      if (attack.signal) expect(attack.signal(signals), `signals: ${JSON.stringify(signals)}`).toBe(true);
      // the platform still serves the sandbox: the agent answers the next step
      const after = await gym.step({ type: 'exec', command: ['echo', 'still served'] });
      expect(after.observation).toMatchObject({ type: 'exec', stdout: 'still served\n' });
    } finally {
      await gym.close();
    }
    expect(hostFingerprint()).toEqual(fingerprint);
    contained.push(attack.name);
  }

  for (const one of ATTACKS) {
    it(`${one.kind}: ${one.name}`, () => attack(one.kind, one.name, () => runAttack(one)), 180_000);
  }
});
