import { copyFile, link, open, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { z } from 'zod';
import {
  SandgymError,
  createMsgpackCodec,
  messageOf,
  silentLogger,
  type Codec,
  type Logger,
} from '../../common/index.ts';
import type {
  Backend,
  BackendCapabilities,
  BackendSandbox,
  CallOptions,
  GcReport,
  LayerImage,
  SandboxRecord,
  SandboxSpec,
} from '../contract.ts';
import { MICROVM_MAX_DEPTH } from '../host/flat-stacks.ts';
import { agentBinaryPath, hostProgram } from '../host/paths.ts';
import { listedRecord, nodeRecordSchema, readNodeRecord, writeNodeRecord } from '../host/node-records.ts';
import { isAlive, processIdentity, signalProcess, type ProcessIdentity } from '../host/processes.ts';
import { runProgram } from '../host/run-program.ts';
import { reclaimExpiredOf } from '../internal/lifetime.ts';
import { cpioArchive } from './cpio.ts';
import { ensureGuestKernel, type GuestKernel } from './guest-kernel.ts';
import { ensureVmImage, type VmImage } from './vm-image.ts';
import { QemuVm, type VmLaunch } from './qemu.ts';
import { checkpointOf } from '../internal/checkpoint-shelf.ts';
import { startFromSnapshot, type VmSnapshot } from './snapshots.ts';
import { VmSandbox } from './vm-sandbox.ts';

/** Options for {@link VmBackend.create}. */
export interface VmBackendOptions {
  /**
   * `microvm` (default): the environment's layers under the agent as init. `vm`: a q35 PC booting
   * a full Debian disk image (systemd, the agent as a service); the environment's layers are not
   * used.
   */
  kind?: 'microvm' | 'vm';
  /** The node's data folder: each VM's folder is `<dataDir>/<kind>s/<id>`. */
  dataDir: string;
  /** Where the guest kernel is kept (shared by nodes that share it): fetched there on first use. */
  guestDir: string;
  logger?: Logger;
  codec?: Codec;
  /** How long a boot may take before the watchdog kills it and boots once more. */
  bootTimeoutMs?: number;
  /** Where the vm kind's image is debootstrapped from. */
  debianMirror?: string;
  /**
   * A deep stack's base flattened into one image on the node (ContainerBackend.flattenStack);
   * without it a microvm refuses a stack deeper than its disk slots.
   */
  flattenStack?: (layers: readonly LayerImage[], maxDepth: number) => Promise<LayerImage[]>;
}

const CAPABILITIES: BackendCapabilities = {
  pause: true,
  hibernate: true,
  // memory, processes and disk, through VmSandbox.checkpoint and VmBackend.restore / fork
  checkpoint: 'memory',
  fork: true,
  shellSessions: false,
  ownNetwork: true,
  networkPolicy: false,
  statefulExec: true,
};

/** Under TCG a boot takes seconds (a full OS, tens of them), and a stuck TSC calibration never ends. */
const DEFAULT_BOOT_TIMEOUT_MS = { microvm: 90_000, vm: 240_000 };
const STOP_GRACE_MS = 3_000;
/** Below this, Debian's initramfs and systemd run the guest out of memory while it boots. */
const MIN_VM_MEMORY_MIB = 384;
const RESTORE_SYNC_MS = 30_000;

const vmStateSchema = nodeRecordSchema.extend({
  backend: z.enum(['microvm', 'vm']),
  /** The QEMU process, so another process can end it. */
  qemu: z.object({ pid: z.number().int(), startTime: z.number() }).optional(),
});
type VmState = z.infer<typeof vmStateSchema>;

/**
 * VMs on QEMU, in two kinds. `vm`: a q35 PC boots the full Debian image (see vm-image.ts), whose
 * systemd starts the agent as a service; each VM writes to a copy-on-write overlay of the image.
 * `microvm` (`-M microvm`): the Debian guest kernel through PVH boot, the agent as init
 * from an initramfs, the environment's EROFS layers as read-only virtio disks with an ext4 disk
 * for the upper dir, and the agent channel over virtio-serial. KVM where `/dev/kvm` is usable,
 * TCG emulation otherwise.
 */
export class VmBackend implements Backend {
  readonly name: 'microvm' | 'vm';
  readonly capabilities = CAPABILITIES;
  private readonly sandboxes = new Map<string, VmSandbox>();
  private readonly logger: Logger;
  private readonly codec: Codec;
  private isClosed = false;

  private constructor(
    private readonly options: VmBackendOptions,
    /** The microvm's kernel, or the vm's image. */
    private readonly boot: { kind: 'microvm'; kernel: GuestKernel } | { kind: 'vm'; image: VmImage },
    private readonly agentPath: string,
    private readonly owner: ProcessIdentity,
  ) {
    this.name = boot.kind;
    this.logger = (options.logger ?? silentLogger()).child({ component: `${boot.kind}-backend` });
    this.codec = options.codec ?? createMsgpackCodec();
  }

  /** Checks QEMU and the agent, and fetches the guest kernel on first use. */
  static async create(given: VmBackendOptions): Promise<VmBackend> {
    const options = { ...given, dataDir: resolve(given.dataDir) };
    hostProgram('qemu-system-x86_64');
    hostProgram('mkfs.ext4');
    const agentPath = agentBinaryPath();
    const owner = await processIdentity(process.pid);
    if (!owner) throw new SandgymError('platform_error', "Cannot read this process's identity from /proc");
    const logger = options.logger ?? silentLogger();
    const boot =
      options.kind === 'vm'
        ? {
            kind: 'vm' as const,
            image: await ensureVmImage(
              join(options.guestDir, 'vm'),
              agentPath,
              options.debianMirror ?? 'http://deb.debian.org/debian',
              logger,
            ),
          }
        : { kind: 'microvm' as const, kernel: await ensureGuestKernel(options.guestDir, logger) };
    hostProgram('qemu-img');
    await mkdir(join(options.dataDir, `${boot.kind}s`), { recursive: true });
    return new VmBackend(options, boot, agentPath, owner);
  }

  /** Where this kind keeps its VMs' folders. */
  private get vmsDir(): string {
    return join(this.options.dataDir, `${this.name}s`);
  }

  private dirOf(id: string): string {
    return join(this.vmsDir, id);
  }

  async create(spec: SandboxSpec, options: CallOptions = {}): Promise<VmSandbox> {
    if (this.isClosed) throw new SandgymError('failed_precondition', `The ${this.name} backend is closed`);
    if (spec.layers.length === 0) {
      throw new SandgymError('invalid_argument', `A ${this.name} needs an environment: name one`);
    }
    if (this.name === 'vm' && spec.resources.memoryMib < MIN_VM_MEMORY_MIB) {
      throw new SandgymError(
        'invalid_argument',
        `A vm boots a full Debian (its initramfs, systemd): ask for memoryMib of at least ${MIN_VM_MEMORY_MIB}, not ${spec.resources.memoryMib}`,
      );
    }
    if (spec.network.length > 0) {
      throw new SandgymError(
        'unsupported',
        `A ${this.name} has loopback only: network rules need a container`,
      );
    }
    const dir = this.dirOf(spec.id);
    await mkdir(dir, { recursive: true });
    try {
      const launch = await this.launchFor(dir, spec);
      const vm = await this.start(launch, options);
      return await this.track(spec, vm, launch);
    } catch (error) {
      await rm(dir, { recursive: true, force: true });
      throw error;
    }
  }

  private async track(spec: SandboxSpec, vm: QemuVm, launch: VmLaunch): Promise<VmSandbox> {
    const createdAt = new Date().toISOString();
    try {
      await this.saveState(launch.dir, spec, vm, createdAt);
    } catch (error) {
      await vm.kill();
      throw error;
    }
    const sandbox = new VmSandbox({
      kind: this.name,
      spec,
      vm,
      launch,
      codec: this.codec,
      snapshotsDir: this.snapshotsDir,
      destroy: (s) => this.destroy(s),
      replaced: (next) => this.saveState(launch.dir, spec, next, createdAt),
    });
    this.sandboxes.set(spec.id, sandbox);
    return sandbox;
  }

  private get snapshotsDir(): string {
    return join(this.options.dataDir, 'vm-snapshots');
  }

  /**
   * A new sandbox from a checkpoint (of any VM of this backend): its processes carry on from
   * where the checkpoint left them, with the time and entropy of now. `spec` names it (its id)
   * and says what it records; its resources and layers are the snapshot's.
   */
  async restoreAsNew(snapshot: VmSnapshot, spec: SandboxSpec): Promise<VmSandbox> {
    if (this.isClosed) throw new SandgymError('failed_precondition', `The ${this.name} backend is closed`);
    const dir = this.dirOf(spec.id);
    await mkdir(dir, { recursive: true });
    try {
      const { vm, launch } = await startFromSnapshot(
        snapshot,
        {
          dir,
          writableDisk: join(
            dir,
            basename(snapshot.recipe.disks[snapshot.recipe.writableIndex]?.path ?? 'rw.img'),
          ),
        },
        this.codec,
        RESTORE_SYNC_MS,
      );
      return await this.track(spec, vm, launch);
    } catch (error) {
      await rm(dir, { recursive: true, force: true });
      throw error;
    }
  }

  /** `count` new sandboxes from one checkpoint, all or none; each diverges on its own from there. */
  async fork(snapshot: VmSnapshot, specs: readonly SandboxSpec[]): Promise<VmSandbox[]> {
    const made: VmSandbox[] = [];
    try {
      // one at a time: under TCG each restore takes a core
      for (const spec of specs) made.push(await this.restoreAsNew(snapshot, spec));
      return made;
    } catch (error) {
      await Promise.all(made.map((sandbox) => sandbox.close().catch(() => undefined)));
      throw error;
    }
  }

  /** New VMs, one per id, from a checkpoint this process's VM `sourceId` made (see VmSandbox.checkpoint). */
  async forkFrom(sourceId: string, checkpointId: string, ids: readonly string[]): Promise<VmSandbox[]> {
    const { source, checkpoint } = checkpointOf(this.live(), sourceId, checkpointId, 'VM');
    return this.fork(
      checkpoint,
      ids.map((id) => source.specFor(id)),
    );
  }

  /** Deletes a checkpoint's files. */
  async dropSnapshot(snapshot: VmSnapshot): Promise<void> {
    await rm(snapshot.dir, { recursive: true, force: true });
  }

  /** Boots, with a watchdog: a boot that does not reach the agent in time is killed and tried once more. */
  /** What a new VM boots: the microvm's layers and writable disk, or an overlay of the vm's image. */
  private async launchFor(dir: string, spec: SandboxSpec): Promise<VmLaunch> {
    const common = { dir, memoryMib: spec.resources.memoryMib, cpus: spec.resources.cpu };
    if (this.boot.kind === 'vm') {
      const disk = join(dir, 'disk.qcow2');
      await runProgram('qemu-img', [
        'create',
        '-q',
        '-f',
        'qcow2',
        '-b',
        this.boot.image.disk,
        '-F',
        'qcow2',
        disk,
      ]);
      return {
        ...common,
        machine: 'q35',
        kernel: this.boot.image.kernel,
        initrd: this.boot.image.initrd,
        append: ['root=/dev/vda', 'rw'],
        disks: [{ path: disk, format: 'qcow2', readonly: false }],
        writableDisk: disk,
      };
    }
    const layers = await this.disksOf(dir, spec.layers);
    const writableDisk = await makeWritableDisk(dir, spec.resources.diskMib);
    return {
      ...common,
      machine: 'microvm',
      kernel: this.boot.kernel.vmlinux,
      initrd: await this.writeInitrd(dir, spec, this.boot.kernel),
      append: ['rdinit=/init', `sandgym.layers=${layers.length}`],
      // the layers, base first, then the writable disk: the order the guest's init expects
      disks: [
        ...layers.map((path) => ({ path, format: 'raw' as const, readonly: true })),
        { path: writableDisk, format: 'raw', readonly: false },
      ],
      writableDisk,
    };
  }

  /**
   * The layer disks of a microvm, base first: at most MICROVM_MAX_DEPTH, a deeper stack's base
   * flattened on the node. A flattened image is linked into the VM's folder, so the node's gc of
   * flattened images (which sees host mounts, not a VM's disks) never takes it from the VM.
   */
  private async disksOf(dir: string, layers: readonly LayerImage[]): Promise<string[]> {
    if (layers.length <= MICROVM_MAX_DEPTH) return layers.map((layer) => layer.path);
    if (!this.options.flattenStack) {
      throw new SandgymError(
        'invalid_argument',
        `The environment stacks ${layers.length} layers and a microvm takes at most ${MICROVM_MAX_DEPTH} (its virtio slots): use a container, or squash the image`,
      );
    }
    const physical = await this.options.flattenStack(layers, MICROVM_MAX_DEPTH);
    return Promise.all(
      physical.map(async (layer, i) => {
        if (layers.some((logical) => logical.digest === layer.digest)) return layer.path;
        const own = join(dir, `flat-${i}.erofs`);
        await link(layer.path, own).catch(() => copyFile(layer.path, own));
        return own;
      }),
    );
  }

  private async start(launch: VmLaunch, options: CallOptions): Promise<QemuVm> {
    const timeoutMs = options.timeoutMs ?? this.options.bootTimeoutMs ?? DEFAULT_BOOT_TIMEOUT_MS[this.name];
    for (let attempt = 1; ; attempt++) {
      const vm = await QemuVm.start(launch, this.codec);
      try {
        await vm.waitReady(launch.dir, timeoutMs);
        return vm;
      } catch (error) {
        await vm.kill();
        if (attempt >= 2 || !(error instanceof SandgymError && error.code === 'timeout')) throw error;
        this.logger.warn({ dir: launch.dir, error: messageOf(error) }, 'VM boot hung; booting again');
      }
    }
  }

  /** The modules' archive, then this VM's: the agent as /init, and the sandbox's environment. */
  private async writeInitrd(dir: string, spec: SandboxSpec, kernel: GuestKernel): Promise<string> {
    const env = {
      PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
      HOME: '/root',
      LANG: 'C.UTF-8',
      ...spec.env,
    };
    const own = cpioArchive([
      { path: 'init', kind: 'file', data: await readFile(this.agentPath), mode: 0o755 },
      { path: 'sandgym', kind: 'dir' },
      {
        path: 'sandgym/env',
        kind: 'file',
        data: Buffer.from(
          Object.entries(env)
            .map(([key, value]) => `${key}=${value}\0`)
            .join(''),
        ),
      },
    ]);
    const path = join(dir, 'initrd');
    await writeFile(path, Buffer.concat([await readFile(kernel.modulesArchive), own]));
    return path;
  }

  private async saveState(dir: string, spec: SandboxSpec, vm: QemuVm, createdAt: string): Promise<void> {
    const state: VmState = {
      id: spec.id,
      backend: this.name,
      owner: this.owner,
      ...(vm.pid ? { qemu: (await processIdentity(vm.pid)) ?? { pid: vm.pid, startTime: 0 } } : {}),
      createdAt,
      layers: spec.layers.map((layer) => layer.digest),
      labels: spec.labels,
    };
    await writeNodeRecord(dir, state, false);
  }

  private readState(id: string): Promise<VmState | undefined> {
    return readNodeRecord(this.dirOf(id), vmStateSchema);
  }

  private async destroy(sandbox: VmSandbox): Promise<void> {
    if (!sandbox.beginStop()) return;
    try {
      await sandbox.stopVm(STOP_GRACE_MS);
      await rm(this.dirOf(sandbox.id), { recursive: true, force: true });
    } finally {
      this.sandboxes.delete(sandbox.id);
      sandbox.markStopped();
    }
  }

  attach(id: string): BackendSandbox {
    const sandbox = this.sandboxes.get(id);
    if (!sandbox)
      throw new SandgymError('not_found', `No live ${this.name} "${id}" of this process: see "sandgym ps"`);
    return sandbox;
  }

  async list(): Promise<SandboxRecord[]> {
    const records: SandboxRecord[] = [];
    for (const id of await readdir(this.vmsDir).catch(() => [] as string[])) {
      const state = await this.readState(id);
      if (!state) continue;
      // this process's VMs as their handles know them; another process's, running as far as it can tell
      const current = this.sandboxes.get(id)?.state;
      const listed = () =>
        Promise.resolve(current === 'paused' || current === 'hibernated' ? current : ('running' as const));
      records.push(await listedRecord(state, this.name, listed));
    }
    return records;
  }

  /** Whether this node has a VM of that id, whichever process owns it. */
  async holds(id: string): Promise<boolean> {
    return this.sandboxes.has(id) || (await this.readState(id)) !== undefined;
  }

  async kill(id: string): Promise<void> {
    const mine = this.sandboxes.get(id);
    if (mine) return mine.close();
    const state = await this.readState(id);
    if (!state) throw new SandgymError('not_found', `No ${this.name} "${id}" on this node: see "sandgym ps"`);
    await this.removeResidue(id, state);
  }

  /** Ends another process's (or a dead one's) QEMU, checked by its start time, and removes its folder. */
  private async removeResidue(id: string, state: VmState): Promise<void> {
    if (state.qemu && (await isAlive(state.qemu))) signalProcess(state.qemu.pid, 'SIGKILL');
    await rm(this.dirOf(id), { recursive: true, force: true });
  }

  withWritableLayerOf<T>(): Promise<T> {
    return Promise.reject(
      new SandgymError(
        'unsupported',
        `A ${this.name}'s writable layer is inside its disk image: it cannot be packed yet`,
      ),
    );
  }

  async gc(): Promise<GcReport> {
    const report: GcReport = { sandboxes: [], mounts: [], cgroups: [] };
    for (const id of await readdir(this.vmsDir).catch(() => [] as string[])) {
      if (this.sandboxes.has(id)) continue;
      const state = await this.readState(id);
      if (state && (await isAlive(state.owner))) continue;
      await this.removeResidue(
        id,
        state ?? { id, backend: this.name, owner: this.owner, createdAt: '', layers: [], labels: {} },
      );
      report.sandboxes.push(id);
    }
    return report;
  }

  gcLayers(): Promise<{ unmounted: string[]; removedCopies: string[] }> {
    return Promise.resolve({ unmounted: [], removedCopies: [] });
  }

  live(): VmSandbox[] {
    return [...this.sandboxes.values()];
  }

  /**
   * None yet: taking a VM over would mean reconnecting its QEMU's control and agent sockets and
   * resynchronising the agent, which this backend does not do. gc ends what a dead owner left.
   */
  adopt(): Promise<VmSandbox[]> {
    return Promise.resolve([]);
  }

  reclaimExpired(now = Date.now()): Promise<string[]> {
    return reclaimExpiredOf(this.live(), now, this.logger);
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    await Promise.all([...this.sandboxes.values()].map((sandbox) => sandbox.close().catch(() => undefined)));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/**
 * A sparse ext4 image of `diskMib` for the upper dir: no journal (the disk dies with the VM, and a
 * journal costs every write twice), inodes made lazily, so it costs a few MiB until written.
 */
async function makeWritableDisk(dir: string, diskMib: number): Promise<string> {
  const path = join(dir, 'rw.img');
  const file = await open(path, 'wx');
  try {
    await file.truncate(diskMib * 2 ** 20);
  } finally {
    await file.close();
  }
  await runProgram('mkfs.ext4', [
    '-q',
    '-F',
    '-O',
    '^has_journal',
    '-m',
    '0',
    '-E',
    'lazy_itable_init=1,nodiscard',
    path,
  ]);
  return path;
}
