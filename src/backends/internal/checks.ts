import { SandgymError } from '../../common/index.ts';

/**
 * Checks a path given for a file call inside a sandbox. The agent checks again; this gives the
 * caller a clear error without a round trip.
 */
export function checkSandboxPath(path: string): void {
  if (typeof path !== 'string' || path.length === 0) {
    throw new SandgymError('invalid_argument', 'Path must be a non-empty string');
  }
  if (!path.startsWith('/')) throw new SandgymError('invalid_argument', `Path "${path}" must be absolute`);
  if (path.includes('\0')) throw new SandgymError('invalid_argument', 'Path must not contain a NUL byte');
  if (path.split('/').includes('..')) {
    throw new SandgymError('invalid_argument', `Path "${path}" must not contain a ".." component`);
  }
}

/** Checks a command's argv: a non-empty list of strings whose first is a program name. */
export function checkArgv(argv: readonly string[]): void {
  if (!Array.isArray(argv) || argv.length === 0 || !argv[0]) {
    throw new SandgymError(
      'invalid_argument',
      'Command is empty: give a program and its arguments, e.g. ["ls", "-l"]',
    );
  }
  if (argv.some((arg) => typeof arg !== 'string' || arg.includes('\0'))) {
    throw new SandgymError('invalid_argument', 'Command arguments must be strings without NUL bytes');
  }
}

/**
 * Checks a command's environment: names that a process environment can hold (non-empty, no `=`)
 * and no NUL byte anywhere, which the kernel would cut the entry at.
 */
export function checkEnv(env: Readonly<Record<string, string>>): void {
  for (const [key, value] of Object.entries(env)) {
    if (key.length === 0 || key.includes('=') || key.includes('\0')) {
      throw new SandgymError(
        'invalid_argument',
        `Environment variable name ${JSON.stringify(key)} is not valid: use a non-empty name without "=" or NUL bytes`,
      );
    }
    if (typeof value !== 'string' || value.includes('\0')) {
      throw new SandgymError(
        'invalid_argument',
        `Environment variable ${key} must be a string without NUL bytes`,
      );
    }
  }
}

/** Throws `cancelled` when the signal has fired. */
export function throwIfAborted(signal: AbortSignal | undefined, what: string): void {
  if (signal?.aborted) throw new SandgymError('cancelled', `${what} was cancelled`, { cause: signal.reason });
}
