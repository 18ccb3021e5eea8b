import { existsSync } from 'node:fs';
import { lstat, unlink } from 'node:fs/promises';
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
  await repairKernelCache(KERNEL_CACHE);
  // the check probes the kernel and, with no cache there yet, saves what it found for every later run
  const checked = await runProgram(criu, ['check'], { timeoutMs: 30_000 }).then(
    () => undefined,
    (error: unknown) => String(error),
  );
  return { usable: checked === undefined, version: text, reason: checked };
}

/**
 * Where CRIU keeps what it learned of the kernel's features (its "kdat"). Every run loads it,
 * and probes the kernel again (40-100 ms of a dump's or restore's time here) only when it is
 * missing. CRIU owns the path and writes it 0600 in root's /run: nothing a sandbox sees.
 */
export const KERNEL_CACHE = '/run/criu.kdat';

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
