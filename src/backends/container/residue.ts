import { existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { SandboxCgroup } from '../host/cgroups.ts';
import { runProgram } from '../host/run-program.ts';
import { signalProcess } from '../host/processes.ts';

/** Where a container sandbox keeps its things on the node. */
export interface ContainerPaths {
  /** `<dataDir>/sandboxes/<id>`: bundle, upper dir, state and logs. */
  dir: string;
  /** The OCI runtime's state root. */
  runtimeRoot: string;
  runtime: string;
}

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
  await step(() => rm(paths.dir, { recursive: true, force: true, maxRetries: 3 }));
  if (errors.length === 1) throw errors[0];
  if (errors.length > 1) throw new AggregateError(errors, `Cannot fully remove sandbox ${id}`);
}

/** SIGKILLs every process in the sandbox's cgroups (thawing first: v1 frozen tasks ignore it) and waits for them. */
async function killAll(cgroup: SandboxCgroup): Promise<void> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const pids = await cgroup.processes();
    if (pids.length === 0) return;
    if (attempt === 0) await cgroup.setFrozen(false).catch(() => undefined);
    for (const pid of pids) signalProcess(pid, 'SIGKILL');
    await sleep(20);
  }
}
