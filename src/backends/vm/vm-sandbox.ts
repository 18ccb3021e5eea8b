import { readFile, rm, stat } from 'node:fs/promises';
import { SandgymError, type Codec } from '../../common/index.ts';
import {
  type CallOptions,
  type CheckpointOptions,
  type HibernateReport,
  type SandboxCheckpoint,
  type SandboxSpec,
  type SandboxStats,
} from '../contract.ts';
import { CheckpointShelf } from '../internal/checkpoint-shelf.ts';
import { folderBytes } from '../internal/folder-size.ts';
import type { AgentChannel, InFlight } from '../internal/agent-channel.ts';
import { AgentSandbox } from '../internal/agent-sandbox.ts';
import { throwIfAborted } from '../internal/checks.ts';
import type { QemuVm, VmLaunch } from './qemu.ts';
import { saveSnapshot, startFromSnapshot, type VmSnapshot } from './snapshots.ts';

/** What a VM sandbox needs from its backend. */
export interface VmSandboxParts {
  kind: 'microvm' | 'vm';
  spec: SandboxSpec;
  vm: QemuVm;
  /** What it was booted from; `writableDisk` is the ext4 image of its upper dir. */
  launch: VmLaunch;
  codec: Codec;
  /** Where its checkpoints and hibernation images go. */
  snapshotsDir: string;
  destroy(sandbox: VmSandbox): Promise<void>;
  /** Its QEMU was replaced (a restore): the state other processes read must name the new one. */
  replaced(vm: QemuVm): Promise<void>;
}

/** How long a restored guest's agent may take to answer on its new channel. */
const RESTORE_SYNC_MS = 30_000;

/** Clock ticks per second of /proc/PID/stat's CPU times (USER_HZ, 100 on Linux). */
const TICKS_PER_SECOND = 100;

/**
 * One microVM: the agent as its init, over a virtio-serial port. Pause stops the virtual CPUs
 * (QMP `stop`); memory and CPU are QEMU's own, as the host sees them; OOM kills are the guest
 * kernel's, from its /proc/vmstat. Checkpoints hold memory and processes (QEMU migration to a
 * file) with the disk; hibernation is a checkpoint and the VM stopped, so its memory is freed.
 */
export class VmSandbox extends AgentSandbox {
  readonly backend: 'microvm' | 'vm';
  private seenOomKills = 0;
  private current: QemuVm;
  /** Set while its QEMU is being replaced (restore, hibernate), whose exit is then expected. */
  private replacing = false;
  /** The restore of a hibernated VM in progress, which every resume meanwhile waits for. */
  private restoring: Promise<void> | undefined;
  private hibernation: { image: VmSnapshot; inFlight: InFlight } | undefined;
  /** Its checkpoints, in its own folder: they go with it. */
  readonly checkpoints: CheckpointShelf<VmSnapshot>;

  constructor(private readonly parts: VmSandboxParts) {
    super(parts.spec, undefined);
    this.backend = parts.kind;
    this.current = parts.vm;
    this.watchVm(parts.vm);
    this.checkpoints = new CheckpointShelf(parts.spec.id, (snapshot) =>
      rm(snapshot.dir, { recursive: true, force: true }),
    );
  }

  private watchVm(vm: QemuVm): void {
    this.watchExit(vm.exited, () => this.current === vm && !this.replacing);
  }

  protected get channel(): AgentChannel {
    return this.current.channel;
  }

  get vm(): QemuVm {
    return this.current;
  }

  /**
   * Saves its memory, processes and disk in the backend's snapshots folder, where it outlives
   * the VM (for {@link VmBackend.fork} and restoreAsNew; the caller drops it); it keeps running.
   */
  async snapshot(options: CallOptions = {}): Promise<VmSnapshot> {
    await this.ready('checkpoint', options.signal);
    return saveSnapshot(this.current, this.parts.launch, this.parts.snapshotsDir, true);
  }

  /** Goes back to a snapshot, in place: processes, memory and files as they were then. */
  async restoreSnapshot(snapshot: VmSnapshot, options: CallOptions = {}): Promise<void> {
    await this.ready('restore', options.signal);
    await this.replaceWith(snapshot);
  }

  /** A snapshot in the VM's own folder, which goes with the VM; it keeps running. */
  async checkpoint(options: CheckpointOptions = {}): Promise<SandboxCheckpoint> {
    await this.ready('checkpoint', options.signal);
    const snapshot = await saveSnapshot(this.current, this.parts.launch, this.parts.launch.dir, true);
    await this.checkpoints.add(snapshot.id, snapshot);
    return {
      id: snapshot.id,
      sandboxId: this.id,
      depth: 'memory',
      sizeBytes: await folderBytes(snapshot.dir),
      createdAt: new Date().toISOString(),
    };
  }

  async restore(checkpoint: SandboxCheckpoint | string, options: CallOptions = {}): Promise<void> {
    const snapshot = this.checkpoints.get(checkpoint);
    if (this.currentState === 'hibernated') await this.resume(); // its QEMU must run to be replaced
    await this.restoreSnapshot(snapshot, options);
  }

  /**
   * Ends its QEMU and starts another from `snapshot`; the sandbox stays the same. Requests in
   * flight fail (the restored guest never saw them) unless `inFlight` carries them over.
   */
  private async replaceWith(snapshot: VmSnapshot, inFlight?: InFlight): Promise<void> {
    this.replacing = true;
    try {
      await this.current.kill();
      const { vm } = await startFromSnapshot(
        snapshot,
        this.parts.launch,
        this.parts.codec,
        RESTORE_SYNC_MS,
        inFlight,
      );
      this.current = vm;
      this.watchVm(vm);
      await this.parts.replaced(vm);
      this.currentState = 'running';
    } catch (error) {
      this.currentState = 'failed';
      this.failureReason = 'platform_error';
      throw error;
    } finally {
      this.replacing = false;
    }
  }

  protected destroy(): Promise<void> {
    return this.parts.destroy(this);
  }

  private async guestOomKills(): Promise<number> {
    const reply = await this.channel.call({ op: 'read', path: '/proc/vmstat', maxBytes: 1 << 16 });
    const text = Buffer.from(reply.data ?? new Uint8Array()).toString();
    return Number(/^oom_kill (\d+)$/m.exec(text)?.[1] ?? 0);
  }

  protected async oomKilledSinceLastCheck(): Promise<boolean> {
    const kills = await this.guestOomKills();
    const killed = kills > this.seenOomKills;
    this.seenOomKills = kills;
    return killed;
  }

  async pause(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Pause');
    if (this.currentState === 'paused') return;
    await this.ready('pause', undefined);
    await this.current.qmp.execute('stop');
    this.currentState = 'paused';
  }

  async resume(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Resume');
    if (this.currentState === 'paused') {
      await this.current.qmp.execute('cont');
      this.currentState = 'running';
    } else if (this.currentState === 'hibernated' && this.hibernation) {
      // one restore, whoever asks while it runs (a rollout that started it, a request after)
      this.restoring ??= this.restoreHibernated(this.hibernation).finally(() => (this.restoring = undefined));
      await this.restoring;
    }
  }

  /** Brings a hibernated VM back from its image, and removes the image. */
  private async restoreHibernated({ image, inFlight }: NonNullable<VmSandbox['hibernation']>): Promise<void> {
    await this.replaceWith(image, inFlight);
    this.hibernation = undefined;
    await rm(image.dir, { recursive: true, force: true });
  }

  /** A checkpoint, then its QEMU ended: all of its memory goes back to the host until a request resumes it. */
  async hibernate(options: CallOptions = {}): Promise<HibernateReport> {
    throwIfAborted(options.signal, 'Hibernate');
    if (this.currentState === 'hibernated') return { state: 'hibernated', freedBytes: 0, residentBytes: 0 };
    if (this.currentState !== 'paused') await this.ready('hibernate', undefined);
    const before = await this.stats();
    const wasRunning = this.currentState === 'running';
    const image = await saveSnapshot(this.current, this.parts.launch, this.parts.launch.dir, wasRunning);
    // the image sits in the VM's own folder, so whatever removes the VM removes it too;
    // its commands keep running in the guest's memory: their answers come on the next channel
    this.hibernation = { image, inFlight: this.current.channel.releaseInFlight() };
    this.replacing = true;
    try {
      await this.current.kill();
    } finally {
      this.replacing = false;
    }
    this.currentState = 'hibernated';
    // its QEMU is gone: nothing of it stays in the node's memory
    return { state: 'hibernated', freedBytes: before.memoryBytes, residentBytes: 0 };
  }

  async stats(options: CallOptions = {}): Promise<SandboxStats> {
    throwIfAborted(options.signal, 'Stats');
    const pid = this.currentState === 'hibernated' ? 0 : this.current.pid;
    const [status, procStat, disk] = await Promise.all([
      readFile(`/proc/${pid}/status`, 'utf8').catch(() => ''),
      readFile(`/proc/${pid}/stat`, 'utf8').catch(() => ''),
      stat(this.parts.launch.writableDisk).catch(() => undefined),
    ]);
    const rssKib = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? 0);
    const fields = procStat.slice(procStat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11] ?? 0) + Number(fields[12] ?? 0);
    const running = this.currentState === 'running';
    // the agent counts the guest's processes besides itself; with it, that is what a cgroup counts
    const others = running
      ? await this.channel.call({ op: 'procs' }).then(
          (r) => r.count ?? 0,
          () => 0,
        )
      : 0;
    return {
      state: this.currentState,
      memoryBytes: rssKib * 1024,
      kernelMemoryBytes: 0,
      pids: running ? others + 1 : 0,
      cpuUsageMs: (ticks / TICKS_PER_SECOND) * 1000,
      oomKills: running ? await this.guestOomKills().catch(() => 0) : this.seenOomKills,
      pidsLimitHits: 0,
      deniedEgress: 0,
      // blocks the writable disk's image holds: what the guest wrote, plus ext4's own metadata
      diskBytes: (disk?.blocks ?? 0) * 512,
    };
  }

  /** A microVM has loopback only: it has no network device to open. */
  async setNetwork(rules: readonly string[]): Promise<void> {
    if (rules.length > 0) {
      throw new SandgymError(
        'unsupported',
        `A ${this.backend} has loopback only: network rules need a container`,
      );
    }
    return Promise.resolve();
  }

  /** Its writable layer is inside the guest's disk image; the audit sees no protected paths of it. */
  writtenPaths(): Promise<string[]> {
    return Promise.resolve([]);
  }

  withWritableLayer<T>(): Promise<T> {
    return Promise.reject(
      new SandgymError(
        'unsupported',
        `A ${this.backend}'s writable layer is inside its disk image: it cannot be packed yet`,
      ),
    );
  }

  /** Ends the guest: the agent powers the VM off; QEMU is killed if it lingers. */
  async stopVm(graceMs: number): Promise<void> {
    if (this.hibernation) await rm(this.hibernation.image.dir, { recursive: true, force: true });
    const vm = this.current;
    if (this.currentState === 'paused') await vm.qmp.execute('cont').catch(() => undefined);
    await vm.channel.shutdown(graceMs).catch(() => undefined);
    const stopped = await Promise.race([
      vm.exited.then(() => true),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), graceMs).unref()),
    ]);
    if (!stopped) await vm.kill();
    else vm.qmp.close();
  }
}
