import { spawnSync } from 'node:child_process';
import { chmod, lstat, mkdtemp, readFile, rename, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { KERNEL_CACHE, criuProgram, detectCriu, repairKernelCache } from '../../src/backends/host/criu.ts';

const criu = await detectCriu();

/** A save CRIU started and never finished: its temporary file, dated well before `now`. */
async function abandonedSave(cache: string, now: number): Promise<void> {
  await writeFile(`${cache}.tmp`, '', { mode: 0o600 });
  const then = new Date(now - 10 * 60_000);
  await utimes(`${cache}.tmp`, then, then);
}

/** Whether /run is a tmpfs, the only kind of folder CRIU keeps its kernel cache in. */
const RUN_IS_TMPFS =
  spawnSync('stat', ['-f', '-c', '%T', '/run'], { encoding: 'utf8' }).stdout.trim() === 'tmpfs';

describe("CRIU's kernel cache", () => {
  it('clears an abandoned save, so the next run can keep its cache; a save in progress is left alone', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'sandgym-kdat-'));
    try {
      const cache = join(dir, 'criu.kdat');
      const now = Date.now();
      await writeFile(`${cache}.tmp`, '', { mode: 0o600 });
      await utimes(`${cache}.tmp`, new Date(now), new Date(now));
      expect(await repairKernelCache(cache, now)).toEqual([]); // another run may be writing it
      await abandonedSave(cache, now);
      expect(await repairKernelCache(cache, now)).toEqual([`${cache}.tmp`]);
      await expect(lstat(`${cache}.tmp`)).rejects.toThrow();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('removes a cache someone other than root could have written; keeps a root-only one', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'sandgym-kdat-'));
    try {
      const cache = join(dir, 'criu.kdat');
      await writeFile(cache, 'forged', { mode: 0o600 });
      await chmod(cache, 0o666);
      expect(await repairKernelCache(cache)).toEqual([cache]);
      // a link could point CRIU's trust anywhere
      await symlink(join(dir, 'elsewhere'), cache);
      expect(await repairKernelCache(cache)).toEqual([cache]);
      await writeFile(cache, 'kept', { mode: 0o600 });
      await abandonedSave(cache, Date.now());
      expect(await repairKernelCache(cache)).toEqual([]); // a cache is in place: nothing to save
      expect(await readFile(cache, 'utf8')).toBe('kept');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it.skipIf(!criu.usable)(
    'detection leaves a root-only cache that later CRIU runs load, even after an abandoned save',
    async () => {
      // the host's own cache, kept aside and put back: other CRIU runs only probe meanwhile
      const aside = `${KERNEL_CACHE}.sandgym-test-${process.pid}`;
      const had = await rename(KERNEL_CACHE, aside).then(
        () => true,
        () => false,
      );
      try {
        await abandonedSave(KERNEL_CACHE, Date.now());
        expect((await detectCriu()).usable).toBe(true);
        // CRIU keeps its cache only on tmpfs ("Can't keep kdat cache on non-tempfs"); where /run
        // is a disk, every run probes the kernel again and no cache is there to check
        if (!RUN_IS_TMPFS) return;
        const made = await lstat(KERNEL_CACHE);
        expect(made.isFile()).toBe(true);
        expect(made.uid).toBe(0);
        expect(made.mode & 0o777).toBe(0o600);
        const log = join(await mkdtemp(join(tmpdir(), 'sandgym-kdat-')), 'check.log');
        const run = spawnSync(criuProgram(), ['check', '-v4', '-o', log]);
        expect(run.status).toBe(0);
        expect(await readFile(log, 'utf8')).toContain(`Loaded kdat cache from ${KERNEL_CACHE}`);
        await rm(join(log, '..'), { recursive: true, force: true });
      } finally {
        await rm(`${KERNEL_CACHE}.tmp`, { force: true }); // what a failing detection left
        if (had) await rename(aside, KERNEL_CACHE);
      }
    },
  );
});
