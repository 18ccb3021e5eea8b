import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

describe('container isolation', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('isolation');
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function withSandbox(
    test: (sandbox: Sandbox) => Promise<void>,
    memoryMib = 128,
    pids = 64,
  ): Promise<void> {
    const sandbox = await env.platform.createSandbox({
      environment: 'busybox:latest',
      resources: { memoryMib, pids },
    });
    try {
      await test(sandbox);
    } catch (error) {
      throw new Error(`in sandbox ${sandbox.id} (logs: ${env.dataDir}/sandboxes/${sandbox.id}/runtime.log)`, {
        cause: error,
      });
    } finally {
      await sandbox.close();
    }
  }

  it('cannot see host processes', async () => {
    await withSandbox(async (sandbox) => {
      const ps = await sandbox.exec(['ps', '-o', 'pid,comm']);
      const pids = ps.stdout
        .trim()
        .split('\n')
        .slice(1)
        .map((line) => Number(line.trim().split(/\s+/)[0]));
      expect(Math.max(...pids)).toBeLessThan(100);
      expect(ps.stdout).not.toContain('node');
      expect(
        (await sandbox.exec(['sh', '-c', 'ls /proc | grep -c "^[0-9]"'])).stdout.trim().length,
      ).toBeGreaterThan(0);
      const self = await sandbox.exec(['cat', '/proc/1/cmdline']);
      expect(self.stdout).toContain('sandgym-agent');
    });
  });

  it('has loopback only, not the host network', async () => {
    await withSandbox(async (sandbox) => {
      const links = await sandbox.exec(['ip', '-o', 'link']);
      const names = links.stdout
        .trim()
        .split('\n')
        .map((l) => l.split(':')[1]?.trim());
      expect(names).toEqual(['lo']);
      const hostLinks = readFileSync('/proc/net/dev', 'utf8');
      expect(hostLinks).not.toBe('');
      const route = await sandbox.exec(['ip', 'route']);
      expect(route.stdout.trim()).toBe('');
      const reach = await sandbox.exec([
        'sh',
        '-c',
        'timeout 5 wget -O - http://127.0.0.1:9/ 2>&1; echo rc=$?',
      ]);
      expect(reach.stdout).toMatch(/Connection refused[\s\S]*rc=1$/m);
    });
  });

  it('survives kill -9 -1 inside, harming nothing outside', async () => {
    const witness = await env.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      await withSandbox(async (sandbox) => {
        await sandbox.exec(['sh', '-c', 'sleep 60 & sleep 60 & kill -9 -1; true']);
        // the agent (pid 1 of the sandbox) is immune to its own processes' signals
        expect((await sandbox.exec(['echo', 'still here'])).stdout).toBe('still here\n');
      });
      expect((await witness.exec(['echo', 'witness ok'])).stdout).toBe('witness ok\n');
      expect(process.kill(process.pid, 0)).toBe(true);
    } finally {
      await witness.close();
    }
  });

  it('stops a fork bomb at the pids limit', async () => {
    await withSandbox(
      async (sandbox) => {
        const bomb = await sandbox.exec(['sh', '-c', 'bomb() { bomb | bomb & }; bomb; sleep 2'], {
          timeoutMs: 5000,
        });
        expect(bomb.stderr + bomb.stdout).toMatch(/fork|Resource temporarily unavailable|can't/i);
        const stats = await sandbox.stats();
        expect(stats.pids).toBeLessThanOrEqual(32);
        // the bomb's processes die with it, and the sandbox keeps working
        await sandbox.exec(['sh', '-c', 'kill -9 -1 2>/dev/null; true']);
        expect((await sandbox.exec(['echo', 'alive'])).stdout).toBe('alive\n');
      },
      128,
      32,
    );
  });

  it('OOM-kills a memory bomb and reports it as oom', async () => {
    await withSandbox(async (sandbox) => {
      // tail buffers its whole input: an endless line grows it without bound
      const bomb = await sandbox.exec(['sh', '-c', 'tail /dev/zero'], { timeoutMs: 60_000 });
      expect(bomb.signal).toBe('SIGKILL');
      expect(bomb.oomKilled).toBe(true);
      expect(bomb.timedOut).toBe(false);
      expect((await sandbox.stats()).oomKills).toBeGreaterThanOrEqual(1);
      expect((await sandbox.exec(['echo', 'agent survived'])).stdout).toBe('agent survived\n');
    }, 64);
  });

  it('applies memory, pids and CPU limits in its cgroups', async () => {
    const sandbox = await env.platform.createSandbox({
      environment: 'busybox:latest',
      resources: { memoryMib: 96, pids: 40, cpu: 0.5 },
    });
    try {
      // inside its cgroup namespace, the sandbox's own cgroup is the root of each hierarchy
      const read = async (v1: string, v2: string): Promise<string> =>
        (await sandbox.exec(['sh', '-c', `cat ${v1} 2>/dev/null || cat ${v2}`])).stdout.trim();
      expect(await read('/sys/fs/cgroup/memory/memory.limit_in_bytes', '/sys/fs/cgroup/memory.max')).toBe(
        String(96 * 2 ** 20),
      );
      expect(await read('/sys/fs/cgroup/pids/pids.max', '/sys/fs/cgroup/pids.max')).toBe('40');
      const cpu = await read('/sys/fs/cgroup/cpu/cpu.cfs_quota_us', '/sys/fs/cgroup/cpu.max');
      expect(cpu.split(' ')[0]).toBe('50000');
    } finally {
      await sandbox.close();
    }
  });

  it('drops capabilities and filters syscalls', async () => {
    await withSandbox(async (sandbox) => {
      const status = await sandbox.exec(['grep', 'CapEff', '/proc/self/status']);
      const effective = BigInt(`0x${status.stdout.split(':')[1]?.trim()}`);
      const CAP_SYS_ADMIN = 21n;
      expect(effective & (1n << CAP_SYS_ADMIN)).toBe(0n);
      const mount = await sandbox.exec(['mount', '-t', 'tmpfs', 'none', '/mnt']);
      expect(mount.exitCode).not.toBe(0);
      const userns = await sandbox.exec(['unshare', '-U', 'true']);
      expect(userns.exitCode).not.toBe(0);
      const mknod = await sandbox.exec(['mknod', '/tmp/sda', 'b', '8', '0']);
      expect(mknod.exitCode).not.toBe(0);
    });
  });

  it('hides the agent channel from processes in the sandbox, root included', async () => {
    await withSandbox(async (sandbox) => {
      // Root may list the names (the folder belongs to root), but not resolve, open or forge them.
      const names = (await sandbox.exec(['ls', '/proc/1/fd'])).stdout.trim().split(/\s+/);
      expect(names.length).toBeGreaterThan(2);
      for (const fd of names) {
        const link = await sandbox.exec(['readlink', `/proc/1/fd/${fd}`]);
        expect(link.exitCode, `readlink /proc/1/fd/${fd}`).not.toBe(0);
        const forge = await sandbox.exec(['sh', '-c', `echo forged > /proc/1/fd/${fd}`]);
        expect(forge.exitCode, `write to /proc/1/fd/${fd}`).not.toBe(0);
      }
      for (const file of ['environ', 'mem', 'maps']) {
        expect((await sandbox.exec(['cat', `/proc/1/${file}`])).exitCode, `/proc/1/${file}`).not.toBe(0);
      }
      const own = await sandbox.exec(['ls', '/proc/self/fd']);
      expect(
        own.stdout
          .trim()
          .split(/\s+/)
          .map(Number)
          .sort((a, b) => a - b),
      ).toEqual([0, 1, 2, 3]);
    });
  });
});
