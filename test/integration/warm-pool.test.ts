import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform } from '../support/platform.ts';

/** The network namespace a command runs in: the same inode means the same container. */
async function networkNamespace(sandbox: Sandbox): Promise<string> {
  return (await sandbox.exec(['readlink', '/proc/self/ns/net'])).stdout.trim();
}

const LEAVE_TRACES = `
set -e
echo secret > /tmp/secret; echo secret > /root/secret; echo secret > /dev/shm/secret; touch /dev/leftover
setsid sleep 1000 < /dev/null > /dev/null 2>&1 &
setsid python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1", 7777)); s.listen(); time.sleep(1000)' < /dev/null > /dev/null 2>&1 &
python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget(0x5a5a, 4096, 0o1666) >= 0, os.strerror(ctypes.get_errno())
assert libc.msgget(0x5a5b, 0o1666) >= 0
assert libc.semget(0x5a5c, 1, 0o1666) >= 0
rt = ctypes.CDLL("librt.so.1", use_errno=True)
assert rt.mq_open(b"/leftover", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0, os.strerror(ctypes.get_errno())
PY
sleep 0.2
`;

const LOOK_FOR_TRACES = `
ls -A /tmp /root /dev/shm /dev/mqueue
ls /dev
ls /proc | grep -E '^[0-9]+$' | wc -l
tail -n +2 /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem
grep -c ':1E61 ' /proc/net/tcp || true
env
`;

describe('warm pool', () => {
  it('gives a repurposed container to the next tenant with nothing of the previous one left', async () => {
    await using test = await createTestPlatform('warm-reuse', { warmPool: { latency: 1 } });
    const { platform } = test;
    await platform.warmPool.filled();
    const first = await platform.createSandbox({
      environment: 'debian:bookworm',
      env: { TENANT_SECRET: 'first-tenant' },
    });
    let namespace: string;
    try {
      namespace = await networkNamespace(first);
      const left = await first.exec(['bash', '-c', LEAVE_TRACES]);
      expect(left.stderr).toBe('');
      expect(left.exitCode).toBe(0);
      expect((await first.exec(['printenv', 'TENANT_SECRET'])).stdout).toBe('first-tenant\n');
    } finally {
      await first.close();
    }
    await platform.warmPool.recycled();
    // scrubbed and pooled again, beside the shell that refilled the pool meanwhile
    expect(platform.warmPool.ready.latency).toBe(2);

    await using second = await platform.createSandbox({ environment: 'debian:bookworm' });
    expect(await networkNamespace(second)).toBe(namespace); // the very same container
    const seen = await second.exec(['bash', '-c', LOOK_FOR_TRACES]);
    expect(seen.exitCode).toBe(0);
    expect(seen.stdout).not.toMatch(/secret|leftover|TENANT_SECRET|first-tenant/);
    const lines = seen.stdout.split('\n');
    // the agent, bash, and the pipeline's own processes; none of the first tenant's
    const processCount = Number(lines.find((l) => /^\d+$/.test(l)));
    expect(processCount).toBeLessThanOrEqual(5);
    expect(seen.stdout).not.toMatch(/sleep|python/);
    // /proc/sysvipc lists no object (tail prints only the file headers), and nothing listens on 7777
    expect(lines.filter((l) => /^\s*\d+\s+\d+/.test(l))).toEqual([]);
    expect(lines).toContain('0');
    const stats = await second.stats();
    expect(stats.pids).toBe(1);
  });

  it("resolves a new tenant's very first file request in its own root", async () => {
    await using test = await createTestPlatform('warm-files', { warmPool: { latency: 1 } });
    const { platform } = test;
    await platform.warmPool.filled();
    const first = await platform.createSandbox({ environment: 'debian:bookworm' });
    try {
      // file requests first, no command before them: the agent must find the swapped root itself
      expect((await first.readFile('/etc/debian_version')).length).toBeGreaterThan(0);
      await first.writeFile('/root/secret', 'first tenant');
    } finally {
      await first.close();
    }
    await platform.warmPool.recycled();
    // the same shell, scrubbed, now on busybox's layers
    await using second = await platform.createSandbox({ environment: 'busybox:latest' });
    await expect(second.readFile('/root/secret')).rejects.toMatchObject({ code: 'not_found' });
    await expect(second.readFile('/etc/debian_version')).rejects.toMatchObject({ code: 'not_found' });
    expect((await second.listDir('/bin')).map((e) => e.name)).toContain('busybox');
    await second.writeFile('/tmp/mine', 'second tenant');
    expect((await second.exec(['cat', '/tmp/mine'])).stdout).toBe('second tenant');
  });

  it('serves a burst from the pool first, then cold, and refills', async () => {
    await using test = await createTestPlatform('warm-burst', { warmPool: { latency: 2 } });
    const { platform } = test;
    await platform.warmPool.filled();
    const burst = await Promise.all(
      Array.from({ length: 4 }, () => platform.createSandbox({ environment: 'busybox:latest' })),
    );
    try {
      expect(platform.warmPool.ready.latency).toBe(0);
      const outputs = await Promise.all(
        burst.map((s) => s.exec(['cat', '/etc/hostname']).catch(() => undefined)),
      );
      expect(outputs).toHaveLength(4);
      for (const sandbox of burst) expect((await sandbox.exec(['true'])).exitCode).toBe(0);
    } finally {
      await Promise.all(burst.map((s) => s.close()));
    }
    await platform.warmPool.recycled();
    await platform.warmPool.filled(30_000);
    // the scrubbed containers are kept, up to twice the target
    expect(platform.warmPool.ready.latency).toBe(4);
    const listed = await platform.listSandboxes();
    expect(listed).toEqual([]); // pooled shells are not sandboxes
  });

  it('swaps in a root of many layers, as deep as fsconfig once refused', async () => {
    await using test = await createTestPlatform('warm-deep', {
      warmPool: { latency: 1 },
      privateStore: true,
    });
    const { platform } = test;
    const context = join(test.dataDir, 'context');
    await mkdir(context, { recursive: true });
    // 6 layers: the stack's lower dirs run far past the 255 bytes fsconfig takes in one string
    const runs = [1, 2, 3, 4, 5].map((n) => `RUN echo ${n} > /layer-${n}`).join('\n');
    await writeFile(join(context, 'Dockerfile'), `FROM busybox:latest\n${runs}\n`);
    const { environment } = await platform.buildFromDockerfile({
      file: join(context, 'Dockerfile'),
      name: 'six:1',
    });
    expect(environment.layers.length).toBe(6);
    await platform.warmPool.filled();
    const first = await platform.createSandbox({ environment: 'busybox:latest' });
    let namespace: string;
    try {
      namespace = await networkNamespace(first);
    } finally {
      await first.close();
    }
    await platform.warmPool.recycled();
    await using second = await platform.createSandbox({ environment: 'six:1' });
    expect(await networkNamespace(second)).toBe(namespace); // the pooled shell, not a cold create
    expect((await second.exec(['cat', '/layer-1', '/layer-5'])).stdout).toBe('1\n5\n');
  });
});
