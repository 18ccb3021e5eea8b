import { randomBytes } from 'node:crypto';
import { mkdir, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { availableParallelism } from 'node:os';
import { ConcurrencyLimit, messageOf, type Logger } from '../../common/index.ts';
import type { CriuSupport } from '../host/criu.ts';
import type { HostHelper } from '../host/host-helper.ts';
import { signalProcess } from '../host/processes.ts';
import { runProgram } from '../host/run-program.ts';
import type { AgentChannel } from '../internal/agent-channel.ts';
import { channelFifos } from '../internal/channel-fifos.ts';
import { folderBytes } from '../internal/folder-size.ts';
import type { AgentProcess, ContainerCheckpoint, ContainerMemory } from './container-sandbox.ts';
import type { ContainerEgress } from './egress.ts';
import type { ContainerLauncher } from './launch.ts';
import { containerInitOf, detachOverlay, dumpTree, mountOverlay, restoreTree } from './memory-image.ts';
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

  constructor(
    private readonly criu: CriuSupport,
    private readonly launcher: ContainerLauncher,
    private readonly helper: HostHelper,
    private readonly egress: ContainerEgress,
    private readonly logger: Logger,
  ) {}

  /** The memory side of a container on an overlay of `lowers` (base first); none without CRIU. */
  forShell(shell: WarmShell, lowers: readonly string[]): ContainerMemory | undefined {
    if (!this.criu.usable) return undefined;
    const { dir } = this.launcher.pathsOf(shell.slot);
    const logged = async <T>(what: string, work: () => Promise<T>): Promise<T> => {
      try {
        return await this.criuRuns.run(work);
      } catch (error) {
        this.logger.warn({ slot: shell.slot, error: messageOf(error) }, `${what} failed`);
        throw error;
      }
    };
    return {
      // its network's veth pair reaches into the node's namespace, which a restore cannot rebuild
      available: () => !this.egress.isAttached(shell.slot),
      unavailableBecause: () =>
        'it is on the node network (its rules name addresses beyond loopback), which a restore cannot rebuild',
      dump: () =>
        logged('memory snapshot', async () => {
          const name = `memory-${randomBytes(6).toString('hex')}`;
          const init = await containerInitOf(await shell.cgroup.members());
          const image = await dumpTree(init, dir, join(dir, name), { afterwards: 'gone' });
          // a successor adopting this sandbox finds its processes there
          await this.recordMemoryImage(dir, name);
          return image;
        }),
      restore: (image) => logged('memory restore', () => this.start(shell, lowers, image.dir)),
      drop: (image) => rm(image.dir, { recursive: true, force: true }),
      checkpoint: () =>
        logged('checkpoint', async () => {
          const id = `ckpt-${randomBytes(6).toString('hex')}`;
          const init = await containerInitOf(await shell.cgroup.members());
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
            upperCopy: join(copy, 'upper'),
            public: {
              id,
              sandboxId: shell.slot,
              depth: 'memory',
              sizeBytes: image.sizeBytes + (await folderBytes(join(copy, 'upper'))),
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
          // its files as they were: the copy's upper dir, reflinked, in place of the current one
          const upper = join(dir, 'rw', 'upper');
          const work = join(dir, 'rw', 'work');
          await emptyFolder(upper);
          await emptyFolder(work);
          await runProgram('cp', ['-a', '--reflink=auto', `${checkpoint.upperCopy}/.`, upper]);
          return this.start(shell, lowers, checkpoint.image.dir);
        }),
    };
  }

  /**
   * Lays out a new container's folder from another's checkpoint (its files, a log, channel FIFOs)
   * and starts the checkpoint's processes there, in the new container's cgroups: a fork. Its
   * cgroup limits are the caller's to write; its scratch slot (`rw`) must exist.
   */
  async startAsNew(
    shell: WarmShell,
    lowers: readonly string[],
    checkpoint: ContainerCheckpoint,
  ): Promise<AgentProcess> {
    const { dir } = this.launcher.pathsOf(shell.slot);
    await runProgram('cp', ['-a', '--reflink=auto', `${checkpoint.upperCopy}/.`, join(dir, 'rw', 'upper')]);
    await Promise.all([mkdir(join(dir, 'rw', 'work')), mkdir(join(dir, 'rootfs'))]);
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
      const image = { dir: imageDir, sizeBytes: 0 };
      opened = await restoreTree(image, dir, rootfs, () => this.launcher.openChannel(shell.slot), cgroupRoot);
    } finally {
      await detachOverlay(rootfs);
    }
    const channel = await this.launcher.syncChannel(shell.slot, opened, RESTORE_SYNC_TIMEOUT_MS);
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

async function emptyFolder(dir: string): Promise<void> {
  for (const name of await readdir(dir)) await rm(join(dir, name), { recursive: true, force: true });
}
