import { readFile, readdir, stat } from 'node:fs/promises';
import { join, relative } from 'node:path';
import type { Sandbox } from '../platform/index.ts';
import type { Deadline } from './deadline.ts';

/** Every regular file below a host folder, recursively. */
export async function filesUnder(dir: string): Promise<string[]> {
  const files: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) files.push(...(await filesUnder(path)));
    else if (entry.isFile()) files.push(path);
  }
  return files;
}

/**
 * Copies a host folder into a sandbox (tests for the grader, the solution for the oracle); with a
 * deadline, each file's write takes its timeout from it.
 */
export async function stageFolder(
  sandbox: Sandbox,
  from: string,
  to: string,
  deadline?: Deadline,
): Promise<void> {
  for (const file of await filesUnder(from)) {
    const mode = (await stat(file)).mode & 0o777;
    await sandbox.writeFile(join(to, relative(from, file)), await readFile(file), {
      ...deadline?.call(),
      mode: mode | 0o444,
    });
  }
}
