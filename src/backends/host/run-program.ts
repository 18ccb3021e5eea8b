import { execFile } from 'node:child_process';
import { SandgymError } from '../../common/index.ts';

/** Options for {@link runProgram}. */
export interface RunProgramOptions {
  timeoutMs?: number;
  /** Extra environment for the program. */
  env?: Record<string, string>;
  /** What the program reads on stdin (an nft transaction). */
  input?: string;
  /** The folder it runs in. */
  cwd?: string;
}

/**
 * Runs a host program for node-level work (mkfs.erofs, crun delete, debootstrap): rare, never per
 * step. Fails with an error that quotes the command and what it printed.
 */
export function runProgram(
  program: string,
  args: string[],
  options: RunProgramOptions = {},
): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      program,
      args,
      {
        timeout: options.timeoutMs ?? 120_000,
        maxBuffer: 64 * 1024 * 1024,
        env: options.env ? { ...process.env, ...options.env } : process.env,
        ...(options.cwd ? { cwd: options.cwd } : {}),
      },
      (error, stdout, stderr) => {
        if (!error) return resolve(stdout);
        const printed = `${stderr}`.trim().split('\n').slice(-5).join(' | ');
        const missing = (error as NodeJS.ErrnoException).code === 'ENOENT';
        reject(
          new SandgymError(
            missing ? 'failed_precondition' : 'platform_error',
            missing
              ? `${program} is not installed: run "sandgym setup" to install the host packages`
              : `${[program, ...args].join(' ')} failed: ${printed || error.message}`,
            { cause: error },
          ),
        );
      },
    );
    // a program that exits before reading its input must not fail the call with EPIPE
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(options.input ?? '');
  });
}
