import { existsSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { messageOf } from '../../common/index.ts';
import type { GcReport, SandboxRecord } from '../contract.ts';
import { SandboxCgroup, listSandboxCgroups } from '../host/cgroups.ts';
import { listedRecord } from '../host/node-records.ts';
import { isAlive } from '../host/processes.ts';
import { runProgram } from '../host/run-program.ts';
import type { ContainerLauncher } from './launch.ts';
import { removeContainerResidue } from './residue.ts';
import { readContainerState, type ContainerState } from './sandbox-record.ts';

/**
 * A container's state as any process sees it, named as its owner's hibernate report names it:
 * hibernated once its memory is written out, to a memory image (its processes are gone) or to
 * swap (frozen, and swap holds some of it); paused while frozen with its memory all resident.
 */
async function containerStateOf(
  state: ContainerState,
  cgroup: SandboxCgroup,
): Promise<'running' | 'paused' | 'hibernated'> {
  if (state.memoryImage) return 'hibernated';
  if (!(await cgroup.isFrozen())) return 'running';
  return (await cgroup.swappedBytes()) > 0 ? 'hibernated' : 'paused';
}

/**
 * The node's container records, whichever process wrote them: each slot's folder says whose
 * sandbox it holds (see sandbox-record.ts), which is how any process lists, finds and kills a
 * sandbox by id, and how gc tells a dead owner's leftovers from a live neighbour's.
 */
export class ContainerRecords {
  constructor(private readonly launcher: ContainerLauncher) {}

  private get dataDir(): string {
    return this.launcher.options.dataDir;
  }

  /**
   * The slot of a sandbox of any process on this node: its own id when it was created cold, else
   * the warm slot whose state names it. Undefined when there is none.
   */
  async slotOf(id: string): Promise<string | undefined> {
    if ((await readContainerState(this.launcher.pathsOf(id).dir))?.id === id) return id;
    const dir = join(this.dataDir, 'sandboxes');
    for (const slot of await readdir(dir).catch(() => [] as string[])) {
      if (slot.startsWith('warm-') && (await readContainerState(join(dir, slot)))?.id === id) return slot;
    }
    return undefined;
  }

  async list(): Promise<SandboxRecord[]> {
    const dir = join(this.dataDir, 'sandboxes');
    const records: SandboxRecord[] = [];
    for (const slot of await readdir(dir).catch(() => [] as string[])) {
      const state = await readContainerState(join(dir, slot));
      if (!state || state.pooled) continue;
      const cgroup = SandboxCgroup.existing(this.launcher.options.layout, this.launcher.options.scope, slot);
      records.push(await listedRecord(state, 'container', () => containerStateOf(state, cgroup)));
    }
    return records;
  }

  /**
   * Removes what dead owners left on the node: their containers (slot, cgroups, runtime state),
   * cgroups whose folder a crash already took, and read-only stack views of their builds. The
   * slots in `mine` are this process's, left alone.
   */
  async sweep(mine: ReadonlySet<string>): Promise<GcReport> {
    const report: GcReport = { sandboxes: [], mounts: [], cgroups: [] };
    const sandboxesDir = join(this.dataDir, 'sandboxes');
    for (const slot of await readdir(sandboxesDir).catch(() => [] as string[])) {
      if (mine.has(slot)) continue;
      const state = await readContainerState(join(sandboxesDir, slot));
      if (state && (await isAlive(state.owner))) continue;
      await removeContainerResidue(
        slot,
        SandboxCgroup.existing(this.launcher.options.layout, this.launcher.options.scope, slot),
        this.launcher.pathsOf(slot),
      );
      if (!state?.pooled) report.sandboxes.push(state?.id ?? slot);
    }
    // cgroups whose sandbox folder is gone: a crash between the two removals
    for (const id of await listSandboxCgroups(this.launcher.options.layout, this.launcher.options.scope)) {
      if (mine.has(id) || existsSync(join(sandboxesDir, id))) continue;
      const cgroup = SandboxCgroup.existing(this.launcher.options.layout, this.launcher.options.scope, id);
      await removeContainerResidue(id, cgroup, this.launcher.pathsOf(id));
      report.cgroups.push(...cgroup.allPaths());
    }
    await this.removeOrphanRuntimeState(mine);
    await this.removeStackViews();
    return report;
  }

  /** Read-only stack views a build of a dead process left mounted (see withLayerStack). */
  private async removeStackViews(): Promise<void> {
    const dir = join(this.dataDir, 'stacks');
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      const [pid, startTime] = name.split('-').map(Number);
      if (pid !== undefined && startTime !== undefined && (await isAlive({ pid, startTime }))) continue;
      await runProgram('umount', [join(dir, name)]).catch(() => undefined);
      await rm(join(dir, name), { recursive: true, force: true }).catch(() => undefined);
    }
  }

  private async removeOrphanRuntimeState(mine: ReadonlySet<string>): Promise<void> {
    const root = join(this.dataDir, 'runtime');
    for (const id of await readdir(root).catch(() => [] as string[])) {
      if (mine.has(id) || existsSync(this.launcher.pathsOf(id).dir)) continue;
      await runProgram(this.launcher.options.runtime, ['--root', root, 'delete', '--force', id]).catch(
        (error: unknown) => {
          this.launcher.options.logger.warn(
            { id, error: messageOf(error) },
            'cannot delete orphaned runtime state',
          );
        },
      );
    }
  }
}
