import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { VmBackend, type SandboxSpec, type VmSandbox } from '../../src/backends/index.ts';
import { STORE_DIR, TEST_DATA_ROOT, busyboxSpecFactory } from '../support/platform.ts';

/** A process that holds 4 MB of known content and, when /tmp/check appears, writes its digest. */
const HOLDER = [
  'p=$(yes sandgym-pattern | head -c 4000000)',
  'echo "$p" | md5sum > /tmp/before',
  'while [ ! -e /tmp/check ]; do sleep 0.05; done',
  'echo "$p" | md5sum > /tmp/after',
].join('; ');

async function waitForFile(sandbox: VmSandbox, path: string): Promise<string> {
  for (let i = 0; i < 400; i++) {
    const read = await sandbox.readFile(path).then(
      (data) => data.toString(),
      () => undefined,
    );
    if (read !== undefined) return read;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`${path} never appeared`);
}

describe('microvm snapshots: checkpoint, restore, fork', () => {
  let backend: VmBackend;
  let dataDir: string;
  let spec: () => SandboxSpec;

  beforeAll(async () => {
    dataDir = join(TEST_DATA_ROOT, `microvm-snapshots-${randomBytes(4).toString('hex')}`);
    backend = await VmBackend.create({ dataDir, guestDir: join(STORE_DIR, 'guest') });
    spec = await busyboxSpecFactory();
  });

  afterAll(async () => {
    await backend?.close();
    await rm(dataDir, { recursive: true, force: true });
  });

  it('keeps a running process and its memory through checkpoint, fork and restore; forks diverge', async () => {
    const origin = await backend.create(spec());
    const forks: VmSandbox[] = [];
    try {
      void origin.execStream(['sh', '-c', HOLDER]).result.catch(() => undefined);
      const before = await waitForFile(origin, '/tmp/before');
      await origin.writeFile('/root/at-checkpoint', 'yes');
      const snapshot = await origin.snapshot();

      // after the checkpoint, the origin goes on and changes
      await origin.writeFile('/root/after-checkpoint', 'later');

      forks.push(...(await backend.fork(snapshot, [spec(), spec()])));
      expect(forks.map((f) => f.id)).toHaveLength(2);
      for (const [i, fork] of forks.entries()) {
        // the process is there, with its memory, and carries on in each fork on its own
        expect((await fork.readFile('/root/at-checkpoint')).toString()).toBe('yes');
        await expect(fork.readFile('/root/after-checkpoint')).rejects.toMatchObject({ code: 'not_found' });
        await fork.writeFile(`/root/fork-${i}`, String(i));
        await fork.writeFile('/tmp/check', '');
        expect(await waitForFile(fork, '/tmp/after')).toBe(before);
      }
      expect((await forks[0]!.exec(['ls', '/root'])).stdout).not.toContain('fork-1');
      expect((await forks[1]!.exec(['ls', '/root'])).stdout).not.toContain('fork-0');
      // no shared random state, and the clock is now, not the checkpoint's
      const draws = await Promise.all(
        forks.map(async (f) => (await f.exec(['sh', '-c', 'head -c 16 /dev/urandom | md5sum'])).stdout),
      );
      expect(draws[0]).not.toBe(draws[1]);
      // each copy its own value to reseed from, in a file and in later commands' environment
      const forkValues = await Promise.all(
        forks.map(async (f) => (await f.readFile('/run/sandgym/fork')).toString()),
      );
      expect(new Set(forkValues).size).toBe(2);
      for (const [i, fork] of forks.entries())
        expect((await fork.exec(['sh', '-c', 'echo $SANDGYM_FORK'])).stdout).toBe(`${forkValues[i]}\n`);
      // a guest's file calls as a user have that user's rights only, as in a container
      await forks[0]!.exec([
        'sh',
        '-c',
        "echo 'app:x:1000:1000::/tmp:/bin/sh' >> /etc/passwd; chmod 700 /root",
      ]);
      await expect(forks[0]!.listDir('/root', { user: 'app' })).rejects.toMatchObject({
        code: 'permission_denied',
      });
      await expect(forks[0]!.writeFile('/etc/passwd', 'x', { user: 'app' })).rejects.toMatchObject({
        code: 'permission_denied',
      });
      await forks[0]!.writeFile('/tmp/mine', 'x', { user: 'app' });
      expect((await forks[0]!.exec(['stat', '-c', '%u', '/tmp/mine'])).stdout).toBe('1000\n');
      for (const fork of forks) {
        const guestNow = Number((await fork.exec(['date', '+%s'])).stdout.trim());
        expect(Math.abs(guestNow - Date.now() / 1000)).toBeLessThan(30);
      }

      // the origin goes back to its checkpoint in place: the later file is gone, the process is back
      await origin.restoreSnapshot(snapshot);
      // other processes find (and can end) the QEMU that now runs it
      const state = JSON.parse(readFileSync(join(dataDir, 'microvms', origin.id, 'state.json'), 'utf8')) as {
        qemu: { pid: number };
      };
      expect(state.qemu.pid).toBe(origin.vm.pid);
      await expect(origin.readFile('/root/after-checkpoint')).rejects.toMatchObject({ code: 'not_found' });
      await origin.writeFile('/tmp/check', '');
      expect(await waitForFile(origin, '/tmp/after')).toBe(before);
      await backend.dropSnapshot(snapshot);
    } finally {
      await Promise.all([origin.close(), ...forks.map((f) => f.close())]);
    }
  });
});
