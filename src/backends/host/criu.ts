import { existsSync } from 'node:fs';
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
  const checked = await runProgram(criu, ['check'], { timeoutMs: 30_000 }).then(
    () => undefined,
    (error: unknown) => String(error),
  );
  return { usable: checked === undefined, version: text, reason: checked };
}
