import { existsSync } from 'node:fs';
import { chmod, lstat, mkdir, readFile, statfs, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from './run-program.ts';

/** Where `sandgym setup --criu` installs the CRIU it builds; preferred over one on the PATH. */
export const INSTALLED_CRIU = '/usr/local/sbin/criu';

/** The CRIU program to run. */
export function criuProgram(): string {
  return existsSync(INSTALLED_CRIU) ? INSTALLED_CRIU : 'criu';
}

/** What the host offers for process-level checkpoints. */
export interface CriuSupport {
  /** A CRIU of at least 4.1 that passes `criu check`: the versions that work on kernels ≥ 6.13. */
  usable: boolean;
  version: string | undefined;
  /** Why it is not usable, naming what to install. */
  reason: string | undefined;
  /**
   * Whether CRIU keeps what it learns of the kernel between runs. Without it, every dump and
   * restore probes the kernel again (40-100 ms each here); `sandgym setup` rebuilds CRIU then.
   */
  kernelCacheKept?: boolean;
}

const MINIMUM = [4, 1] as const;

/** Detects CRIU at run time. Nothing depends on it: without it, checkpoints stay disk-level. */
export async function detectCriu(): Promise<CriuSupport> {
  const criu = criuProgram();
  const printed = await runProgram(criu, ['--version'], { timeoutMs: 10_000 }).catch(() => undefined);
  if (printed === undefined) {
    return {
      usable: false,
      version: undefined,
      reason: 'criu is not installed (4.1 or newer is needed: `sandgym setup --criu` builds it)',
    };
  }
  const version = /Version:\s*(\d+)\.(\d+)/.exec(printed);
  const [major, minor] = [Number(version?.[1] ?? 0), Number(version?.[2] ?? 0)];
  const text = version ? `${major}.${minor}` : 'unknown';
  if (major < MINIMUM[0] || (major === MINIMUM[0] && minor < MINIMUM[1])) {
    return {
      usable: false,
      version: text,
      reason: `criu ${text} is too old: 4.1 or newer works on this kernel (\`sandgym setup --criu\` builds it)`,
    };
  }
  const folder = await kernelCacheFolder(criu);
  await repairKernelCache(join(folder, KERNEL_CACHE_NAME));
  // the check probes the kernel and, with no cache there yet, saves what it found for every later run
  const checked = await runProgram(criu, ['check'], { timeoutMs: 30_000 }).then(
    () => undefined,
    (error: unknown) => String(error),
  );
  const kernelCacheKept = (await statfs(folder)).type === TMPFS_MAGIC;
  return { usable: checked === undefined, version: text, reason: checked, kernelCacheKept };
}

/**
 * The file in which CRIU keeps what it learned of the kernel's features (its "kdat"). Every run
 * loads it, and probes the kernel again (40-100 ms of a dump's or restore's time here) only when
 * it is missing. CRIU keeps it only on a tmpfs (so that a reboot drops it), in the folder named
 * when it was built: /run for most builds. CRIU owns the file and writes it 0600, in a folder
 * only root may write: nothing a sandbox sees.
 */
export const KERNEL_CACHE_NAME = 'criu.kdat';

/**
 * The folder the CRIU that `sandgym setup` builds keeps its kernel cache in (its RUNDIR), a
 * tmpfs of its own: on hosts whose /run is a disk (this one's is ext2), a CRIU built for /run
 * can keep no cache at all, and a save it started there stays behind and stops every later one.
 */
export const SANDGYM_CRIU_RUN_DIR = '/run/sandgym-criu';

/** statfs's magic number for tmpfs. */
const TMPFS_MAGIC = 0x01021994;

/**
 * The folder `criu` keeps its kernel cache in, made ready to keep it: for a CRIU built by
 * `sandgym setup` (its binary names the folder), a root-only tmpfs mounted there unless one is
 * already (mounts do not outlive a reboot, as the cache must not); for any other, /run.
 */
export async function kernelCacheFolder(criu: string): Promise<string> {
  // only the CRIU setup installs can name sandgym's folder; one on the PATH keeps its own
  const binary =
    criu === INSTALLED_CRIU ? await readFile(criu).catch(() => Buffer.alloc(0)) : Buffer.alloc(0);
  if (!binary.includes(`${SANDGYM_CRIU_RUN_DIR}/`)) return '/run';
  await mkdir(SANDGYM_CRIU_RUN_DIR, { recursive: true, mode: 0o700 });
  if ((await statfs(SANDGYM_CRIU_RUN_DIR)).type !== TMPFS_MAGIC) {
    // two detections at once may both mount; the later one's hides the earlier's, both empty
    await runProgram('mount', [
      '-t',
      'tmpfs',
      '-o',
      'mode=0700,size=1m,nosuid,nodev,noexec',
      'sandgym-criu',
      SANDGYM_CRIU_RUN_DIR,
    ]);
  }
  await chmod(SANDGYM_CRIU_RUN_DIR, 0o700);
  return SANDGYM_CRIU_RUN_DIR;
}

/**
 * A save of CRIU's kernel cache older than this is one no CRIU is writing any more (a save
 * takes microseconds between creating its temporary file and renaming it into place).
 */
const STALE_SAVE_MS = 60_000;

/**
 * Makes sure the next CRIU run can keep its kernel cache at `cache`, and that the one there is
 * CRIU's own. A cache that is not a root-owned file only root can write is removed: CRIU trusts
 * it whole, and makes a new one. And so is the temporary file of a save that never finished (a
 * CRIU killed mid-save): CRIU creates it exclusively and gives up silently when it exists, so
 * one left behind made every later run probe the kernel again, for good. A temporary file that
 * another run may still be writing is left alone. Returns what it removed.
 */
export async function repairKernelCache(cache: string, now = Date.now()): Promise<string[]> {
  const removed: string[] = [];
  const kept = await lstat(cache).catch(() => undefined);
  if (kept && (!kept.isFile() || kept.uid !== 0 || (kept.mode & 0o077) !== 0)) {
    await unlink(cache);
    removed.push(cache);
  } else if (kept) {
    return removed;
  }
  const pending = `${cache}.tmp`;
  const left = await lstat(pending).catch(() => undefined);
  if (left && now - left.mtimeMs >= STALE_SAVE_MS) {
    await unlink(pending);
    removed.push(pending);
  }
  return removed;
}
