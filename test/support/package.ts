import { spawnSync, type SpawnSyncOptions } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { expect } from 'vitest';
import { STORE_DIR } from './platform.ts';

/** Runs a command to its end and expects it to succeed, showing its output when it does not. */
export function runOk(command: string, args: string[], options: SpawnSyncOptions = {}): string {
  const result = spawnSync(command, args, { encoding: 'utf8', timeout: 600_000, ...options });
  const output = `${String(result.stdout)}\n${String(result.stderr)}`;
  expect(result.status, `${command} ${args.join(' ')}:\n${output}`).toBe(0);
  return String(result.stdout);
}

/** The checkout packed with `npm pack` and installed into a new ES module project, as a user would. */
export interface InstalledPackage {
  /** The user's project folder, with sandgym in its node_modules. */
  project: string;
  /** The tarball `npm pack` made. */
  tarball: string;
  /** The paths the tarball holds. */
  files: string[];
}

/** Packs the checkout (its dist/ built) into `work` and installs it into `work/project`. */
export async function packAndInstall(work: string): Promise<InstalledPackage> {
  const packed = JSON.parse(
    runOk('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work]),
  ) as {
    filename: string;
    files: { path: string }[];
  }[];
  const tarball = join(work, packed[0]!.filename);
  const project = join(work, 'project');
  await mkdir(project);
  await writeFile(
    join(project, 'package.json'),
    JSON.stringify({ name: 'user-job', private: true, type: 'module' }),
  );
  runOk('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', tarball], { cwd: project });
  return { project, tarball, files: packed[0]!.files.map((file) => file.path) };
}

/**
 * The environment an installed package runs in: its data in `dataDir`, the suite's layer store,
 * and the agent `sandgym setup` compiles there (not the checkout's).
 */
export function installedEnv(dataDir: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, SANDGYM_DATA_DIR: dataDir, SANDGYM_STORE: STORE_DIR };
  delete env['SANDGYM_AGENT'];
  return env;
}
