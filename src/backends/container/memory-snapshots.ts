import { randomBytes } from 'node:crypto';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { availableParallelism } from 'node:os';
import { ConcurrencyLimit, messageOf, type Logger } from '../../common/index.ts';
import { hostCanGrantSysResource } from '../host/capabilities.ts';
import type { CriuSupport } from '../host/criu.ts';
import type { HostHelper } from '../host/host-helper.ts';
import type { ScratchSlot, ScratchVolume } from '../host/scratch-volume.ts';
import { signalProcess } from '../host/processes.ts';
import { runProgram } from '../host/run-program.ts';
import type { AgentChannel } from '../internal/agent-channel.ts';
import { channelFifos } from '../internal/channel-fifos.ts';
import type { AgentProcess, ContainerCheckpoint, ContainerMemory } from './container-sandbox.ts';
import type { ContainerEgress } from './egress.ts';
import type { ContainerLauncher } from './launch.ts';
import {
  assertCriuCanDump,
  containerInitOf,
  detachOverlay,
  dumpTree,
  mountOverlay,
  restoreTree,
} from './memory-image.ts';
import { releaseKeptNetwork } from './kept-network.ts';
import { killAll } from './residue.ts';
import { readContainerState, type ContainerState } from './sandbox-record.ts';
import type { WarmShell } from './warm-pool.ts';

/** How long an agent restored from a memory image may take to answer on its new channel. */
const RESTORE_SYNC_TIMEOUT_MS = 10_000;

/**
 * Containers' processes to disk and back with CRIU: hibernation by memory image, checkpoints and
 * their restore in place. For containers with their own overlay (a pooled shell's swapped-in
 * root is not one CRIU can stand up again), on hosts whose CRIU works.
 */
export class ContainerMemorySnapshots {
  /** CRIU runs at once: each is a process busy for the sandbox's memory size; a run's preemption starts hundreds. */
  private readonly criuRuns = new ConcurrencyLimit(2 * availableParallelism());
  /** Whether CRIU may read the limits of processes of any user here (see assertCriuCanDump). */
  private readonly sysResource = hostCanGrantSysResource();

  constructor(
    private readonly criu: CriuSupport,
    private readonly launcher: ContainerLauncher,
    private readonly helper: HostHelper,
    private readonly scratch: ScratchVolume,
    private readonly egress: ContainerEgress,
    private readonly logger: Logger,
  ) {}

  /** The memory side of a container on an overlay of `lowers` (base first); none without CRIU. */
  forShell(shell: WarmShell, lowers: readonly string[]): ContainerMemory | undefined {
    if (!this.criu.usable) return undefined;
    const { dir } = this.launcher.pathsOf(shell.slot);
    const dumpable = async (): Promise<number> => {
      const members = await shell.cgroup.members();
      await assertCriuCanDump(members, await this.sysResource);
      return containerInitOf(members);
    };
    const logged = async <T>(what: string, work: () => Promise<T>, key?: object): Promise<T> => {
      try {
        return await this.criuRuns.run(work, key);
      } catch (error) {
        this.logger.warn({ slot: shell.slot, error: messageOf(error) }, `${what} failed`);
        throw error;
      }
    };
    return {
      // a veth pair on the node network or a group reaches into the node's namespace, which a
      // restore cannot rebuild: its processes would come back off the network
      available: () => !this.egress.hasOuterLinks(shell.slot),
      unavailableBecause: () =>
        'it is on the node network (its rules name addresses beyond loopback) or a group network, which a restore cannot rebuild',
      dump: () =>
        logged('memory snapshot', async () => {
          const name = `memory-${randomBytes(6).toString('hex')}`;
          const init = await dumpable();
          const image = await dumpTree(init, dir, join(dir, name), { afterwards: 'gone' });
          // a successor adopting this sandbox finds its processes there
          await this.recordMemoryImage(dir, name);
          return image;
        }),
      restore: (image) => logged('memory restore', () => this.start(shell, lowers, image.dir), image),
      hurry: (image) => this.criuRuns.hurry(image),
      drop: async (image) => {
        await releaseKeptNetwork(image.dir);
        await rm(image.dir, { recursive: true, force: true });
      },
      checkpoint: () =>
        logged('checkpoint', async () => {
          const id = `ckpt-${randomBytes(6).toString('hex')}`;
          const init = await dumpable();
          const image = await dumpTree(init, dir, join(dir, `memory-${id}`), { afterwards: 'stopped' });
          // the files at the instant of the dump: its processes stay stopped until the copy is made
          const copy = join(dir, `diff-${id.slice(5)}`);
          try {
            await this.helper.snapshot(join(dir, 'rw'), copy);
          } finally {
            for (const pid of await shell.cgroup.members()) signalProcess(pid, 'SIGCONT');
          }
          const made: ContainerCheckpoint = {
            image,
            copy,
            public: {
              id,
              sandboxId: shell.slot,
              depth: 'memory',
              // its writes as their quota group counts them: a tenant's tree is never walked here
              sizeBytes: image.sizeBytes + (this.scratch.usedNow(shell.scratch) ?? 0),
              createdAt: new Date().toISOString(),
            },
          };
          return made;
        }),
      dropCheckpoint: async (checkpoint) => {
        await rm(checkpoint.image.dir, { recursive: true, force: true });
        await this.helper.deleteSubvolume(checkpoint.copy);
      },
      restoreCheckpoint: (checkpoint) =>
        logged('checkpoint restore', async () => {
          await killAll(shell.cgroup);
          // its files as they were: a snapshot of the checkpoint's copy in place of its writable layer
          shell.scratch = await this.writableLayerFrom(checkpoint, shell.slot, shell.diskMib);
          return this.start(shell, lowers, checkpoint.image.dir);
        }),
    };
  }

  /**
   * Makes `slot`'s writable layer (`rw`) a btrfs snapshot of a checkpoint's copy, capped at the
   * slot's disk cap: nothing walks the tenant's tree, however deep it is.
   */
  async writableLayerFrom(
    checkpoint: ContainerCheckpoint,
    slot: string,
    diskMib: number,
  ): Promise<ScratchSlot> {
    const { dir } = this.launcher.pathsOf(slot);
    const rw = join(dir, 'rw');
    await mkdir(dir, { recursive: true });
    await this.helper.deleteSubvolume(rw);
    await this.helper.snapshot(checkpoint.copy, rw);
    return this.scratch.createSlot(slot, diskMib * 2 ** 20);
  }

  /**
   * Lays out the rest of a new container's folder (a log, channel FIFOs) beside its writable
   * layer (see {@link writableLayerFrom}) and starts a checkpoint's processes there, in the new
   * container's cgroups: a fork. Its cgroup limits are the caller's to write.
   */
  async startAsNew(
    shell: WarmShell,
    lowers: readonly string[],
    checkpoint: ContainerCheckpoint,
  ): Promise<AgentProcess> {
    const { dir } = this.launcher.pathsOf(shell.slot);
    await mkdir(join(dir, 'rootfs'));
    // what the helper makes for a launch, as it makes them (a restore checks their modes)
    await runProgram('mkfifo', ['-m', '0600', ...Object.values(channelFifos(dir))]);
    await writeFile(join(dir, 'runtime.log'), '', { mode: 0o644 });
    await shell.cgroup.prepare();
    return this.start(shell, lowers, checkpoint.image.dir, `/${shell.cgroup.relativePath}`);
  }

  /** Starts the processes of the image in `imageDir` on the container's overlay; its new agent. */
  private async start(
    shell: WarmShell,
    lowers: readonly string[],
    imageDir: string,
    cgroupRoot?: string,
  ): Promise<AgentProcess> {
    const { dir } = this.launcher.pathsOf(shell.slot);
    const rootfs = join(dir, 'rootfs');
    await mountOverlay(rootfs, lowers, dir);
    let opened: AgentChannel;
    try {
      opened = await restoreTree(
        imageDir,
        dir,
        rootfs,
        () => this.launcher.openChannel(shell.slot),
        cgroupRoot,
      );
    } catch (error) {
      await detachOverlay(rootfs);
      throw error;
    }
    // the node's mounts go while the agent answers (the restored processes hold their own root
    // and network namespace), off the first request's path; a failure is thrown once all are done
    const [answered, ...released] = await Promise.allSettled([
      this.connect(shell, dir, opened),
      detachOverlay(rootfs),
      releaseKeptNetwork(imageDir),
    ]);
    if (answered.status === 'rejected') throw answered.reason;
    for (const outcome of released) if (outcome.status === 'rejected') throw outcome.reason;
    return answered.value;
  }

  /** Takes the restored agent's channel as the container's, once it answers on it. */
  private async connect(shell: WarmShell, dir: string, opened: AgentChannel): Promise<AgentProcess> {
    const channel = await this.launcher.syncChannel(shell.slot, opened, RESTORE_SYNC_TIMEOUT_MS);
    await channel.restored({ kernel: false, timeoutMs: RESTORE_SYNC_TIMEOUT_MS });
    await this.recordMemoryImage(dir, undefined);
    shell.channel = channel;
    shell.exited = channel.closed;
    delete shell.agentPid;
    return { channel, exited: channel.closed };
  }

  /** Notes in a sandbox's record where its processes are while it hibernates (or that they run again). */
  private async recordMemoryImage(dir: string, name: string | undefined): Promise<void> {
    const state = await readContainerState(dir);
    if (!state) return;
    const updated: ContainerState = { ...state, memoryImage: name };
    if (!name) delete updated.memoryImage;
    await this.launcher.saveState(dir, updated);
  }
}
