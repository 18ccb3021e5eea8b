import { randomBytes } from 'node:crypto';
import { copyFile, link, mkdir, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SandgymError, type Codec } from '../../common/index.ts';
import { runProgram } from '../host/run-program.ts';
import type { InFlight } from '../internal/agent-channel.ts';
import { QemuVm, type VmLaunch } from './qemu.ts';

/** What a VM was started with that a restore must repeat: all but its folder and writable disk. */
type Recipe = Omit<VmLaunch, 'dir' | 'incoming' | 'writableDisk' | 'initrd'> & {
  /** Which of `disks` is the writable one (its path there is the original VM's). */
  writableIndex: number;
};

/**
 * A VM's memory and device state (QEMU migration to a file) with a copy of its writable disk
 * taken at the same instant, in its own folder. What restore, fork and hibernate start from.
 */
export interface VmSnapshot {
  id: string;
  dir: string;
  recipe: Recipe;
}

/** How long a migration to a file may take; QEMU under TCG writes hundreds of MiB a second. */
const MIGRATION_TIMEOUT_MS = 120_000;

/**
 * Saves a running or paused VM: stops its CPUs, streams its memory and devices to a file, copies
 * its writable disk (sparse), and lets it run again if it was running. The disk copy is taken
 * while the CPUs are stopped, so memory and disk agree.
 */
export async function saveSnapshot(
  vm: QemuVm,
  launch: VmLaunch,
  snapshotsDir: string,
  wasRunning: boolean,
): Promise<VmSnapshot> {
  const id = `snap-${randomBytes(8).toString('hex')}`;
  const dir = join(snapshotsDir, id);
  await mkdir(dir, { recursive: true });
  try {
    if (wasRunning) await vm.qmp.execute('stop');
    await vm.qmp.execute('migrate', { uri: `exec:cat > ${join(dir, 'memory')}` });
    await waitForMigration(vm);
    await runProgram('cp', ['--sparse=always', launch.writableDisk, join(dir, 'disk')]);
    await link(launch.initrd, join(dir, 'initrd')).catch(() => copyFile(launch.initrd, join(dir, 'initrd')));
    const writableIndex = launch.disks.findIndex((disk) => disk.path === launch.writableDisk);
    // a read-only disk of the VM's own folder (a deep stack's flattened base) goes with the
    // snapshot: the folder goes when the VM ends, and a restore must still find it
    const disks = await Promise.all(
      launch.disks.map(async (disk, i) => {
        if (!disk.readonly || dirname(disk.path) !== launch.dir) return disk;
        const kept = join(dir, `disk-${i}`);
        await link(disk.path, kept).catch(() => copyFile(disk.path, kept));
        return { ...disk, path: kept };
      }),
    );
    const { machine, kernel, append, memoryMib, cpus } = launch;
    const snapshot: VmSnapshot = {
      id,
      dir,
      recipe: { machine, kernel, append, disks, writableIndex, memoryMib, cpus },
    };
    await writeFile(join(dir, 'snapshot.json'), JSON.stringify({ id, recipe: snapshot.recipe }));
    return snapshot;
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  } finally {
    if (wasRunning) await vm.qmp.execute('cont').catch(() => undefined);
  }
}

async function waitForMigration(vm: QemuVm): Promise<void> {
  const deadline = Date.now() + MIGRATION_TIMEOUT_MS;
  for (;;) {
    const info = (await vm.qmp.execute('query-migrate')) as { status?: string; 'error-desc'?: string };
    if (info.status === 'completed') return;
    if (info.status === 'failed' || info.status === 'cancelled') {
      throw new SandgymError(
        'platform_error',
        `Saving the VM's memory failed: ${info['error-desc'] ?? info.status}`,
      );
    }
    if (Date.now() > deadline)
      throw new SandgymError('timeout', `Saving the VM's memory took over ${MIGRATION_TIMEOUT_MS} ms`);
    await sleep(20);
  }
}

/**
 * Starts a VM from a snapshot: its writable disk becomes a copy of the snapshot's, QEMU takes the
 * memory file as incoming migration, and once running, the agent (which never knew it stopped)
 * is found again on a fresh channel and given the time and new entropy.
 */
export async function startFromSnapshot(
  snapshot: VmSnapshot,
  /** The VM's folder and where its writable disk goes (a copy of the snapshot's). */
  place: { dir: string; writableDisk: string },
  codec: Codec,
  syncTimeoutMs: number,
  /** Requests of the VM's previous channel to carry on (a hibernated VM's commands). */
  inFlight?: InFlight,
): Promise<{ vm: QemuVm; launch: VmLaunch }> {
  await runProgram('cp', ['--sparse=always', join(snapshot.dir, 'disk'), place.writableDisk]);
  const { writableIndex, ...recipe } = snapshot.recipe;
  const full: VmLaunch = {
    ...recipe,
    ...place,
    disks: recipe.disks.map((disk, i) =>
      i === writableIndex ? { ...disk, path: place.writableDisk } : disk,
    ),
    initrd: join(snapshot.dir, 'initrd'),
    incoming: join(snapshot.dir, 'memory'),
  };
  const vm = await QemuVm.start(full, codec, { restoring: true });
  try {
    await waitUntilIncomingDone(vm);
    // before the guest runs: what its agent sends for them from now on must find them
    if (inFlight) vm.channel.adoptInFlight(inFlight);
    await vm.qmp.execute('cont');
    await vm.channel.sync(syncTimeoutMs);
    await vm.channel.restored({ kernel: true, timeoutMs: syncTimeoutMs });
    return { vm, launch: full };
  } catch (error) {
    await vm.kill();
    throw error;
  }
}

async function waitUntilIncomingDone(vm: QemuVm): Promise<void> {
  const deadline = Date.now() + MIGRATION_TIMEOUT_MS;
  for (;;) {
    const { status } = (await vm.qmp.execute('query-status')) as { status?: string };
    if (status && status !== 'inmigrate') return;
    if (Date.now() > deadline)
      throw new SandgymError('timeout', `Restoring the VM's memory took over ${MIGRATION_TIMEOUT_MS} ms`);
    await sleep(20);
  }
}
