import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { SandgymError } from '../../common/index.ts';

/** The package root: the nearest folder above this module with a package.json. */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) throw new SandgymError('platform_error', 'Cannot find the sandgym package root');
    dir = parent;
  }
  return dir;
}

/** The static agent binary that `npm run build` compiles (override with SANDGYM_AGENT). */
export function agentBinaryPath(): string {
  const path = process.env['SANDGYM_AGENT'] ?? join(packageRoot(), 'build', 'sandgym-agent');
  if (!existsSync(path)) {
    throw new SandgymError(
      'failed_precondition',
      `The sandbox agent ${path} is missing: run "npm run build"`,
    );
  }
  return path;
}

/** Locates a host program on the usual system paths. */
export function hostProgram(name: string): string {
  for (const dir of ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin']) {
    const path = join(dir, name);
    if (existsSync(path)) return path;
  }
  throw new SandgymError('failed_precondition', `${name} is not installed: run "sandgym setup"`);
}
