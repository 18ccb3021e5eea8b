import { spawnSync } from 'node:child_process';
import { chmod, lstat, mkdtemp, readFile, rename, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  INSTALLED_CRIU,
  KERNEL_CACHE_NAME,
  SANDGYM_CRIU_RUN_DIR,
  criuProgram,
  detectCriu,
  kernelCacheFolder,
  repairKernelCache,
} from '../../src/backends/host/criu.ts';

const criu = await detectCriu();

/** A save CRIU started and never finished: its temporary file, dated well before `now`. */
async function abandonedSave(cache: string, now: number): Promise<void> {
  await writeFile(`${cache}.tmp`, '', { mode: 0o600 });
  const then = new Date(now - 10 * 60_000);
  await utimes(`${cache}.tmp`, then, then);
}

/** Where this host's CRIU keeps its kernel cache, and whether that is a tmpfs (the only kind it keeps it in). */
const CACHE_FOLDER = criu.usable ? await kernelCacheFolder(criuProgram()) : '/run';
const KERNEL_CACHE = join(CACHE_FOLDER, KERNEL_CACHE_NAME);
const FOLDER_IS_TMPFS =
  spawnSync('stat', ['-f', '-c', '%T', CACHE_FOLDER], { encoding: 'utf8' }).stdout.trim() === 'tmpfs';

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

  it.skipIf(!criu.usable || criuProgram() !== INSTALLED_CRIU)(
    "setup's CRIU keeps its cache in a root-only tmpfs of its own, mounted again after a reboot took it",
    async () => {
      expect(CACHE_FOLDER).toBe(SANDGYM_CRIU_RUN_DIR);
      // what a reboot leaves where /run is a disk: the folder, with no tmpfs on it
      spawnSync('umount', [SANDGYM_CRIU_RUN_DIR]);
      const detected = await detectCriu();
      expect(detected).toMatchObject({ usable: true, kernelCacheKept: true });
      const mounted = spawnSync('findmnt', ['-n', '-o', 'FSTYPE,OPTIONS', SANDGYM_CRIU_RUN_DIR], {
        encoding: 'utf8',
      });
      expect(mounted.stdout).toMatch(/^tmpfs .*nosuid,nodev,noexec/);
      expect(mounted.stdout.trim().split('\n')).toHaveLength(1);
      expect((await lstat(SANDGYM_CRIU_RUN_DIR)).mode & 0o777).toBe(0o700);
      expect((await lstat(KERNEL_CACHE)).isFile()).toBe(true);
    },
  );

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
        // CRIU keeps its cache only on tmpfs ("Can't keep kdat cache on non-tempfs"): what
        // detection says, and a CRIU built by setup always has one
        expect((await detectCriu()).kernelCacheKept).toBe(FOLDER_IS_TMPFS);
        if (!FOLDER_IS_TMPFS) return;
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
