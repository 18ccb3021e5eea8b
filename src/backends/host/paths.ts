import { createHash } from 'node:crypto';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, resolve, sep } from 'node:path';
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

/** Whether sandgym runs as an installed npm package (under node_modules), not from a checkout. */
export function isInstalledPackage(): boolean {
  return packageRoot().split(sep).includes('node_modules');
}

/** Where an installed sandgym keeps its data when $SANDGYM_DATA_DIR does not say. */
const INSTALLED_DATA_DIR = '/var/lib/sandgym';

/**
 * The node's data folder: $SANDGYM_DATA_DIR, else `/var/lib/sandgym` for an installed package
 * (never inside node_modules, which a reinstall replaces), else `.sandgym` in the checkout.
 */
export function defaultDataDir(): string {
  const given = process.env['SANDGYM_DATA_DIR'];
  if (given) return resolve(given);
  return isInstalledPackage() ? INSTALLED_DATA_DIR : join(packageRoot(), '.sandgym');
}

/** The agent's C sources and Makefile, shipped with the package. */
export function agentSourceDir(): string {
  return join(packageRoot(), 'agent');
}

let sourceDigest: string | undefined;

/** A digest of the agent's sources: an installed agent is rebuilt whenever they change. */
function agentSourceDigest(): string {
  if (sourceDigest) return sourceDigest;
  const dir = agentSourceDir();
  const hash = createHash('sha256');
  for (const name of readdirSync(dir).sort()) {
    if (!/\.(c|h)$|^Makefile$/.test(name)) continue;
    hash
      .update(name)
      .update('\0')
      .update(readFileSync(join(dir, name)))
      .update('\0');
  }
  sourceDigest = hash.digest('hex').slice(0, 16);
  return sourceDigest;
}

/**
 * Where the static agent binary is: $SANDGYM_AGENT; in a checkout, what `npm run build`
 * compiles (build/sandgym-agent); in an installed package, what `sandgym setup` compiles into
 * the data folder, named by its sources' digest so an upgrade builds a new one.
 */
export function agentBinaryTarget(): string {
  const given = process.env['SANDGYM_AGENT'];
  if (given) return given;
  if (!isInstalledPackage()) return join(packageRoot(), 'build', 'sandgym-agent');
  return join(defaultDataDir(), 'bin', `sandgym-agent-${agentSourceDigest()}`);
}

/** The static agent binary, which must exist (see {@link agentBinaryTarget}). */
export function agentBinaryPath(): string {
  const path = agentBinaryTarget();
  if (!existsSync(path)) {
    const fix = isInstalledPackage() ? 'sandgym setup' : 'npm run build';
    throw new SandgymError('failed_precondition', `The sandbox agent ${path} is missing: run "${fix}"`);
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
