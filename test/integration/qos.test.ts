import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

/** The scheduling class a sandbox's commands run in, and whether they can leave it. */
const PROBE = `
import os
policy = {os.SCHED_OTHER: 'other', os.SCHED_IDLE: 'idle', os.SCHED_BATCH: 'batch'}.get(os.sched_getscheduler(0), '?')
try:
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    escaped = policy != 'other'
except PermissionError:
    escaped = False
print(policy, 'escaped' if escaped else 'kept')
`;

describe('CPU QoS classes', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('qos', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it.each([
    // best-effort: SCHED_IDLE, which a sandbox cannot leave, at the lowest CPU weight
    { qos: 'best_effort' as const, expected: 'idle kept', shares: '2' },
    // latency-sensitive: the normal class at full weight
    { qos: 'latency' as const, expected: 'other kept', shares: '1024' },
  ])(
    'runs $qos sandboxes in their CPU class ($expected, cpu.shares $shares)',
    async ({ qos, expected, shares }) => {
      await using sandbox = await env.platform.createSandbox({ environment: 'debian:bookworm', qos });
      const probe = await sandbox.exec(['python3', '-c', PROBE]);
      expect(probe.stdout.trim()).toBe(expected);
      expect(cgroupValue(sandbox.id, 'cpu.shares')).toBe(shares);
    },
  );
});

/** A cgroup file of a sandbox, from whichever hierarchy has it (cpu.shares: cgroup v1, as on these hosts). */
function cgroupValue(sandboxId: string, file: string): string {
  const dirs = execFileSync('find', ['/sys/fs/cgroup', '-maxdepth', '6', '-type', 'd', '-name', sandboxId], {
    encoding: 'utf8',
  })
    .split('\n')
    .filter(Boolean);
  for (const dir of dirs) {
    try {
      return readFileSync(`${dir}/${file}`, 'utf8').trim();
    } catch {
      // not the cpu hierarchy
    }
  }
  throw new Error(`no ${file} for ${sandboxId} in ${dirs.join(', ')}`);
}
