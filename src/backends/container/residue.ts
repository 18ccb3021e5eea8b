import { existsSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { SandboxCgroup } from '../host/cgroups.ts';
import { runProgram } from '../host/run-program.ts';
import { signalProcess } from '../host/processes.ts';
import { releaseKeptNetworksUnder } from './kept-network.ts';

/** Where a container sandbox keeps its things on the node. */
export interface ContainerPaths {
  /** `<dataDir>/sandboxes/<id>`: bundle, upper dir, state and logs. */
  dir: string;
  /** The OCI runtime's state root. */
  runtimeRoot: string;
  runtime: string;
  /**
   * Deletes a btrfs subvolume whatever it holds: its writable layer (`rw`) and private copies of it
   * (`diff-*`). A tenant's tree can be too deep for any path-based delete (`rm` fails with
   * ENAMETOOLONG past PATH_MAX); the kernel deletes a subvolume without walking paths.
   */
  deleteSubvolume(path: string): Promise<void>;
}

/** The btrfs subvolumes a container's folder may hold: its writable layer and copies of it. */
const SUBVOLUMES = /^(rw|diff-[0-9a-f]+)$/;

/**
 * Removes every trace of one container sandbox: its processes, the runtime's state, its
 * cgroups and its folder. Safe to run on a half-created or already-removed sandbox, by the
 * owner on close or by `gc`/`kill` from another process.
 */
export async function removeContainerResidue(
  id: string,
  cgroup: SandboxCgroup,
  paths: ContainerPaths,
): Promise<void> {
  const errors: unknown[] = [];
  const step = async (work: () => Promise<unknown>): Promise<void> => {
    try {
      await work();
    } catch (error) {
      errors.push(error);
    }
  };
  await step(() => killAll(cgroup));
  if (existsSync(join(paths.runtimeRoot, id))) {
    await step(() => runProgram(paths.runtime, ['--root', paths.runtimeRoot, 'delete', '--force', id]));
  }
  await step(() => cgroup.remove());
  for (const name of await readdir(paths.dir).catch(() => [] as string[])) {
    if (SUBVOLUMES.test(name)) await step(() => paths.deleteSubvolume(join(paths.dir, name)));
  }
  // a hibernated sandbox's network namespace, held by a mount in its folder
  await step(() => releaseKeptNetworksUnder(paths.dir));
  await step(() => rm(paths.dir, { recursive: true, force: true, maxRetries: 3 }));
  if (errors.length === 1) throw errors[0];
  if (errors.length > 1) throw new AggregateError(errors, `Cannot fully remove sandbox ${id}`);
}

/** SIGKILLs every process in the sandbox's cgroups (thawing first: v1 frozen tasks ignore it) and waits for them. */
export async function killAll(cgroup: SandboxCgroup): Promise<void> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const pids = await cgroup.processes();
    if (pids.length === 0) return;
    if (attempt === 0) await cgroup.setFrozen(false).catch(() => undefined);
    for (const pid of pids) signalProcess(pid, 'SIGKILL');
    await sleep(20);
  }
}
