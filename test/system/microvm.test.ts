import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { release } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runProgram } from '../../src/backends/index.ts';
import { LayerStore } from '../../src/platform/index.ts';
import { CLI } from '../../examples/cluster/netns-cluster.ts';
import { createTestPlatform, STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';

describe('microvm through the platform', () => {
  it('boots a 40-layer stack, more than its 21 disk slots, on a flattened base', async () => {
    await using env = await createTestPlatform('microvm-deep', { privateStore: true });
    const store = await LayerStore.open(join(env.dataDir, 'store'));
    const base = await store.getEnvironment('busybox:latest');
    const layers = [...base.layers];
    for (let i = layers.length + 1; i <= 40; i++) {
      const tree = join(env.dataDir, 'trees', String(i));
      await mkdir(join(tree, 'deep'), { recursive: true });
      await writeFile(join(tree, 'deep', String(i)), `${i}\n`);
      // layer 30 deletes layer 2's file: a whiteout inside the flattened base
      if (i === 30) await runProgram('mknod', [join(tree, 'deep', '2'), 'c', '0', '0']);
      layers.push((await store.addLayerFromDirectory(tree, `layer ${i}`)).digest);
    }
    await store.putEnvironment({ name: 'deep', version: '40', layers, config: base.config });
    await using sandbox = await env.platform.createSandbox({ backend: 'microvm', environment: 'deep:40' });
    const seen = await sandbox.exec([
      'sh',
      '-c',
      'cat /deep/3 /deep/40; ls /deep | wc -l; test -e /deep/2 || echo gone',
    ]);
    expect(seen.stdout).toBe('3\n40\n38\ngone\n');
  });

  it('runs `sandgym run --backend microvm -- uname -a` in the guest kernel, and leaves nothing', async () => {
    const dataDir = join(TEST_DATA_ROOT, `microvm-cli-${randomBytes(4).toString('hex')}`);
    try {
      const run = spawnSync(
        'node',
        [CLI, 'run', '--backend', 'microvm', '--env', 'busybox:latest', '--', 'uname', '-a'],
        {
          env: { ...process.env, SANDGYM_DATA_DIR: dataDir, SANDGYM_STORE: STORE_DIR },
          encoding: 'utf8',
          timeout: 180_000,
        },
      );
      expect(run.status, run.stderr).toBe(0);
      expect(run.stdout).toMatch(/^Linux sandbox \S+-amd64 .*Debian/);
      expect(run.stdout).not.toContain(release()); // the guest's kernel, not the host's
      expect(
        existsSync(join(dataDir, 'microvms'))
          ? spawnSync('ls', [join(dataDir, 'microvms')]).stdout.toString()
          : '',
      ).toBe('');
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });

  it('reclaims a microvm at its idle TTL, as it does a container', async () => {
    await using env = await createTestPlatform('microvm-lifetime');
    const sandbox = await env.platform.createSandbox({
      backend: 'microvm',
      environment: 'busybox:latest',
      lifetime: { idleTtlMs: 500 },
    });
    try {
      for (let polls = 0; (await env.platform.listSandboxes()).some((r) => r.id === sandbox.id); polls++) {
        if (polls > 600) throw new Error('the idle TTL never reclaimed the microvm');
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(sandbox.failure).toBe('timeout');
      await expect(sandbox.exec(['true'])).rejects.toThrow();
    } finally {
      await sandbox.close();
    }
  });

  it('joins a run: preempted snapshots it to disk and ends QEMU, rollout brings its processes back', async () => {
    await using env = await createTestPlatform('microvm-run');
    const run = await env.platform.startRun({ name: 'microvm-run', leaseMs: 120_000 });
    const sandbox = await env.platform.createSandbox({
      backend: 'microvm',
      environment: 'busybox:latest',
      run: run.name,
    });
    try {
      const started = await sandbox.exec([
        'sh',
        '-c',
        'sh -c "i=0; while true; do i=\\$((i+1)); echo \\$i > /root/count; sleep 0.2; done" >/dev/null 2>&1 & echo $!',
      ]);
      const loop = started.stdout.trim();
      expect(loop).toMatch(/^\d+$/);
      const before = await sandbox.stats();
      const preempted = await run.phase('preempted');
      expect(preempted.hibernated).toEqual([sandbox.id]);
      // QEMU is gone: what the VM held is back with the host
      expect(preempted.freedBytes).toBeGreaterThan(before.memoryBytes * 0.9);
      const hibernated = await sandbox.stats();
      expect(hibernated.state).toBe('hibernated');
      expect(hibernated.memoryBytes).toBe(0);
      const rollout = await run.phase('rollout');
      expect(rollout.resumed).toEqual([sandbox.id]);
      // the same process, still counting
      expect((await sandbox.exec(['kill', '-0', loop])).exitCode).toBe(0);
      const count = async (): Promise<number> =>
        Number((await sandbox.exec(['cat', '/root/count'])).stdout.trim());
      const first = await count();
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      expect(await count()).toBeGreaterThan(first);
      expect((await run.end()).destroyed).toEqual([sandbox.id]);
    } finally {
      await sandbox.close();
    }
  });

  it('forks a microvm at memory depth: each copy carries on its processes, then goes its own way', async () => {
    await using env = await createTestPlatform('microvm-fork');
    const source = await env.platform.createSandbox({ backend: 'microvm', environment: 'busybox:latest' });
    try {
      const loop = (
        await source.exec(['sh', '-c', 'sh -c "while true; do sleep 0.2; done" >/dev/null 2>&1 & echo $!'])
      ).stdout.trim();
      await source.writeFile('/root/note', 'from the source');
      await using group = await env.platform.fork(source, 2, { depth: 'memory' });
      expect(group.sandboxes.map((s) => s.backend)).toEqual(['microvm', 'microvm']);
      for (const [i, copy] of group.sandboxes.entries()) {
        expect((await copy.exec(['kill', '-0', loop])).exitCode).toBe(0);
        expect((await copy.readFile('/root/note')).toString()).toBe('from the source');
        await copy.writeFile('/root/note', `copy ${i}`);
      }
      expect((await group.sandboxes[0]!.readFile('/root/note')).toString()).toBe('copy 0');
      expect((await source.readFile('/root/note')).toString()).toBe('from the source');
      await expect(env.platform.fork(source, 0, { depth: 'memory' })).rejects.toThrow(/count must be 1/);
    } finally {
      await source.close();
    }
  });

  it('lists, measures and kills a microvm like any sandbox', async () => {
    await using env = await createTestPlatform('microvm-platform');
    const sandbox = await env.platform.createSandbox({ backend: 'microvm', environment: 'busybox:latest' });
    try {
      expect(sandbox.backend).toBe('microvm');
      expect((await env.platform.listSandboxes()).map((r) => [r.id, r.backend])).toContainEqual([
        sandbox.id,
        'microvm',
      ]);
      await sandbox.writeFile('/root/note', 'kept in the guest');
      expect((await sandbox.exec(['cat', '/root/note'])).stdout).toBe('kept in the guest');
      const stats = await sandbox.stats();
      expect(stats.memoryBytes).toBeGreaterThan(16 * 2 ** 20);
      await env.platform.killSandbox(sandbox.id);
      expect(await env.platform.listSandboxes()).toEqual([]);
    } finally {
      await sandbox.close();
    }
  });
});
