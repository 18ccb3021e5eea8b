import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readdir, rm } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import {
  SandgymError,
  createMsgpackCodec,
  messageOf,
  definedFields,
  settleAll,
  silentLogger,
  type Codec,
  type Logger,
} from '../../common/index.ts';
import type {
  Backend,
  BackendCapabilities,
  BackendSandbox,
  LayerImage,
  CallOptions,
  GcReport,
  LayerVerification,
  LoadMode,
  SandboxRecord,
  SandboxSpec,
  QosClass,
  WritableLayerOptions,
} from '../contract.ts';
import {
  SandboxCgroup,
  detectCgroupLayout,
  removeIdleParents,
  cgroupScope,
  type CgroupLayout,
  type UsageBaseline,
  baselineOf,
} from '../host/cgroups.ts';
import { LayerMounts } from '../host/layer-mounts.ts';
import { LayerTarballs } from '../host/layer-tarballs.ts';
import { CONTAINER_MAX_DEPTH } from '../host/flat-stacks.ts';
import { mountOverlay } from '../host/overlay-mount.ts';
import { agentBinaryPath, hostProgram } from '../host/paths.ts';
import { isAlive, processIdentity, type ProcessIdentity } from '../host/processes.ts';
import { HostHelper } from '../host/host-helper.ts';
import { raisePtyLimit } from '../host/pty-room.ts';
import { weakLinkProtections } from '../host/link-protections.ts';
import { hostCanGrantSysResource } from '../host/capabilities.ts';
import { detectCriu, type CriuSupport } from '../host/criu.ts';
import type { NetworkRuleBook } from '../host/network-rules.ts';
import { removeStaleGroups, type GroupNetwork } from '../host/group-network.ts';
import { ScratchVolume, type ScratchSlot, type VolumeRoom } from '../host/scratch-volume.ts';
import { runProgram } from '../host/run-program.ts';
import { closedChannel, type AgentChannel } from '../internal/agent-channel.ts';
import { checkpointOf } from '../internal/checkpoint-shelf.ts';
import { throwIfAborted } from '../internal/checks.ts';
import { reclaimExpiredOf } from '../internal/lifetime.ts';
import { ContainerSandbox, type ContainerCheckpoint, type ContainerMemory } from './container-sandbox.ts';
import { memoryImageAt, type MemoryImage } from './memory-image.ts';
import { ContainerMemorySnapshots } from './memory-snapshots.ts';
import { NOTHING_FILTERED, consumeFiltered, type PrivateCopy } from './private-copy.ts';
import type { FilterReport } from '../host/diff-filter.ts';
import { removeContainerResidue } from './residue.ts';
import { readContainerState, type ContainerState } from './sandbox-record.ts';
import { WarmPool, type WarmPoolPolicy, type WarmShell } from './warm-pool.ts';
import { ContainerEgress } from './egress.ts';
import { ContainerLauncher } from './launch.ts';
import { ContainerRecords } from './node-records.ts';
import { ContainerReuse, soleProcess } from './reuse.ts';

/** Options for {@link ContainerBackend.create}. */
export interface ContainerBackendOptions {
  /** The node's data folder: sandboxes, layer mounts and runtime state live below it. */
  dataDir: string;
  logger?: Logger;
  codec?: Codec;
  /** How long a sandbox may take to report ready. */
  startTimeoutMs?: number;
  /** How long a closing sandbox gets to exit before it is killed. */
  stopGraceMs?: number;
  /** How layers reach this node; default `ondemand`. */
  loadMode?: LoadMode;
  /** What is checked before mounting a layer; default `digest`. */
  verifyLayers?: LayerVerification;
  /**
   * The deepest layer stack mounted as it is (default {@link CONTAINER_MAX_DEPTH}); a deeper
   * one's base is flattened into one image (see FlatStacks).
   */
  maxStackDepth?: number;
  /** What the node keeps of flattened images, in bytes (default 8 GiB). */
  flatStackCapBytes?: number;
  /**
   * Sandboxes outlive this process (a node agent): after a crash, the next process on the same
   * data dir adopts them with {@link ContainerBackend.adopt}. Otherwise they end with their owner.
   */
  durable?: boolean;
  /**
   * Runs before a sandbox's processes are dumped to the memory image it hibernates to: the one
   * sandbox state that outlives the host (a durable sandbox's image is adopted by the host's next
   * process, even after a power loss). The platform syncs the sandbox's trajectory log here, so
   * the image holds no step its log could lose. A failure stops the dump (the sandbox is then
   * hibernated by reclaim, which a host crash ends).
   */
  beforeImage?: (sandboxId: string) => Promise<void>;
  /** Warm shells kept ready per CPU class (see {@link WarmPool}); none by default. */
  warmPool?: WarmPoolPolicy;
  /** The node's named network rules, which sandboxes' policies name (see {@link NetworkRuleBook}). */
  networkRules?: NetworkRuleBook;
  /**
   * Control plane endpoints no container's rules ever reach (see ContainerEgress.guard); more can
   * be added with {@link ContainerBackend.guardControlPlane}.
   */
  controlPlane?: readonly string[];
}

/**
 * The limits a pooled shell runs under until a tenant brings its own: a sandbox request's
 * defaults, so that most tenants need no cgroup writes at all.
 */
const SHELL_RESOURCES = { cpu: 1, memoryMib: 512, pids: 512, outputCapBytes: 1 << 20, diskMib: 10 * 1024 };

/** How long a reopened channel may take to answer its sync before the sandbox counts as lost. */
const ADOPT_SYNC_TIMEOUT_MS = 3_000;

const CAPABILITIES: BackendCapabilities = {
  pause: true,
  hibernate: true,
  checkpoint: 'disk',
  fork: false,
  shellSessions: false,
  ownNetwork: true,
  networkPolicy: true,
  statefulExec: true,
};

/**
 * Containers launched by crun: the agent as pid 1 on an overlay of shared EROFS layer mounts,
 * in new pid, mount, network, ipc, uts and cgroup namespaces, with cgroup limits, dropped
 * capabilities and a seccomp filter.
 */
export class ContainerBackend implements Backend {
  readonly name = 'container' as const;
  /** Checkpoints reach memory and processes where the host's CRIU works (`sandgym setup --criu`). */
  readonly capabilities: BackendCapabilities;
  private readonly sandboxes = new Set<ContainerSandbox>();
  /** Containers being readied for the pool after their tenant ended (see {@link destroy}). */
  private readonly recycling = new Set<Promise<void>>();
  private readonly pool: WarmPool;
  private readonly logger: Logger;
  private readonly codec: Codec;
  private isClosed = false;
  private readonly scope: string;
  private readonly egress: ContainerEgress;
  private readonly launcher: ContainerLauncher;
  /** Fresh roots for reused containers: warm shells that take a tenant, FnCall workers between calls. */
  readonly reuse: ContainerReuse;
  private readonly records: ContainerRecords;
  private readonly memory: ContainerMemorySnapshots;

  private constructor(
    private readonly options: ContainerBackendOptions,
    private readonly layout: CgroupLayout,
    private readonly owner: ProcessIdentity,
    private readonly agentPath: string,
    private readonly runtime: string,
    private readonly mounts: LayerMounts,
    private readonly tarballs: LayerTarballs,
    private readonly scratch: ScratchVolume,
    private readonly helper: HostHelper,
    /** Whether agents may hold CAP_SYS_RESOURCE to keep out of the OOM killer's reach. */
    private readonly hostHasSysResource: boolean,
    /** What the host offers for process checkpoints: hibernation by memory image needs it. */
    private readonly criu: CriuSupport,
  ) {
    this.capabilities = { ...CAPABILITIES, checkpoint: criu.usable ? 'memory' : 'disk' };
    this.logger = (options.logger ?? silentLogger()).child({ component: 'container-backend' });
    this.codec = options.codec ?? createMsgpackCodec();
    this.scope = cgroupScope(options.dataDir);
    this.egress = new ContainerEgress(options.dataDir, options.networkRules ?? {}, options.controlPlane);
    this.launcher = new ContainerLauncher({
      dataDir: options.dataDir,
      durable: options.durable ?? false,
      startTimeoutMs: options.startTimeoutMs,
      stopGraceMs: options.stopGraceMs,
      layout,
      scope: this.scope,
      owner,
      agentPath,
      runtime,
      helper,
      hostHasSysResource,
      codec: this.codec,
      logger: this.logger,
      egress: this.egress,
    });
    this.reuse = new ContainerReuse(this.launcher, mounts, this.egress);
    this.records = new ContainerRecords(this.launcher);
    this.memory = new ContainerMemorySnapshots(
      criu,
      this.launcher,
      helper,
      scratch,
      this.egress,
      this.logger,
    );
    // empty unless asked for (a node's --warm-pool, a batch's growWarmPool): no shell is made,
    // and no container kept, for a platform that runs one command
    this.pool = new WarmPool(
      options.warmPool ?? {},
      {
        createShell: (qos) => this.createShell(qos),
        destroyShell: (shell) => this.launcher.teardown(shell),
      },
      this.logger,
    );
  }

  /** The names of the node's network rules (its rule book): what builds pick their package mirrors from. */
  ruleNames(): string[] {
    return Object.keys(this.egress.ruleBook);
  }

  /** Keeps every container's network off more of the control plane (see ContainerEgress.guard). */
  guardControlPlane(endpoints: readonly string[]): Promise<void> {
    return this.egress.guard(endpoints);
  }

  /**
   * Hands `consume` a read-only view of a layer stack's merged tree on this host: a build's
   * `COPY --from` an earlier stage, or a look at its /etc/passwd. One layer is its own EROFS
   * mount; several are a read-only overlay of them, mounted on a folder of the data dir for the
   * duration (its lower dirs named relative to the mounts' folder, so a deep stack fits the
   * mount options' page).
   */
  async withLayerStack<T>(
    layers: readonly LayerImage[],
    consume: (root: string) => Promise<T>,
    options: { above?: string } = {},
  ): Promise<T> {
    if (layers.length === 0 && options.above) return consume(options.above);
    if (layers.length === 0) {
      const empty = join(this.options.dataDir, 'stacks', this.stackViewName());
      await mkdir(empty, { recursive: true });
      try {
        return await consume(empty);
      } finally {
        await rm(empty, { recursive: true, force: true });
      }
    }
    const points = await this.mounts.acquire(layers);
    try {
      if (points.length === 1 && !options.above) return await consume(points[0] ?? '');
      const view = join(this.options.dataDir, 'stacks', this.stackViewName());
      await mkdir(view, { recursive: true });
      await mountOverlay(view, [...points, ...(options.above ? [options.above] : [])]);
      try {
        return await consume(view);
      } finally {
        await runProgram('umount', [view]).catch(() => undefined);
        await rm(view, { recursive: true, force: true });
      }
    } finally {
      this.mounts.release(layers);
    }
  }

  /** A stack view's folder name: its process's identity first, so gc leaves a live one's alone. */
  private stackViewName(): string {
    return `${this.owner.pid}-${this.owner.startTime}-${randomBytes(6).toString('hex')}`;
  }

  /** What the node's sandbox volume can hold and take now (every container's writes land there). */
  diskRoom(): Promise<VolumeRoom> {
    return this.scratch.room();
  }

  /** {@link diskRoom} once what ended sandboxes held is free (see ScratchVolume.reclaim). */
  reclaimDisk(): Promise<VolumeRoom> {
    return this.scratch.reclaim();
  }

  /** Warm shells ready now, per CPU class. */
  get warmShells(): Record<QosClass, number> {
    return this.pool.ready;
  }

  /** Resolves once the warm pool holds what its policy asks for. */
  async warmPoolFilled(timeoutMs?: number): Promise<void> {
    await this.pool.filled(timeoutMs);
  }

  /** Resolves once every container whose tenant ended is back in the pool (or destroyed). */
  async recycled(): Promise<void> {
    while (this.recycling.size > 0) await Promise.allSettled([...this.recycling]);
  }

  /** Raises the warm pool's targets to at least `policy`'s (see WarmPool.grow). */
  growWarmPool(policy: WarmPoolPolicy): void {
    if (!this.isClosed) this.pool.grow(policy);
  }

  /** Checks the host (agent binary, crun, cgroups) and prepares the data folder. */
  static async create(given: ContainerBackendOptions): Promise<ContainerBackend> {
    const options = { ...given, dataDir: resolve(given.dataDir) };
    if (process.getuid?.() !== 0) {
      throw new SandgymError('permission_denied', 'The container backend needs root: run sandgym as root');
    }
    const agentPath = agentBinaryPath();
    const runtime = hostProgram('crun');
    const layout = await detectCgroupLayout();
    await raisePtyLimit();
    // Warned, not refused: the sysctls are the host's, for its operator to own, and only a sandbox
    // with two users (a non-root agent beside root tests or services) is exposed; `sandgym setup`
    // sets them, so only a host changed after it, or never set up, warns.
    const weak = await weakLinkProtections();
    if (weak.length > 0)
      given.logger?.warn(
        { sysctls: weak },
        'link protections are off: root in a sandbox can follow a link its non-root agent left in /tmp; run `sandgym setup` (docs/security.md)',
      );
    const owner = await processIdentity(process.pid);
    if (!owner) throw new SandgymError('platform_error', "Cannot read this process's identity from /proc");
    await Promise.all(
      ['layers', 'runtime', ...['proc', 'sys', 'dev', '.sandgym-stage'].map((d) => `shell-root/${d}`)].map(
        (d) => mkdir(join(options.dataDir, d), { recursive: true }),
      ),
    );
    const mode = options.loadMode ?? 'ondemand';
    const mounts = new LayerMounts(
      join(options.dataDir, 'layers'),
      agentPath,
      {
        mode: mode === 'eager' ? 'eager' : 'ondemand',
        verify: options.verifyLayers ?? 'digest',
        copiesDir: join(options.dataDir, 'layer-copies'),
      },
      owner,
      {
        dir: join(options.dataDir, 'layers-flat'),
        maxDepth: options.maxStackDepth ?? CONTAINER_MAX_DEPTH,
        ...(options.flatStackCapBytes === undefined ? {} : { capBytes: options.flatStackCapBytes }),
      },
    );
    const helper = new HostHelper(agentPath);
    const scratch = await ScratchVolume.open(
      join(options.dataDir, 'sandboxes'),
      join(options.dataDir, 'sandboxes.img'),
      helper,
    );
    return new ContainerBackend(
      options,
      layout,
      owner,
      agentPath,
      runtime,
      mounts,
      new LayerTarballs(mounts),
      scratch,
      helper,
      await hostCanGrantSysResource(),
      await detectCriu(),
    );
  }

  async create(spec: SandboxSpec, options: CallOptions = {}): Promise<ContainerSandbox> {
    if (this.isClosed) throw new SandgymError('failed_precondition', 'The container backend is closed');
    if (spec.layers.length === 0) {
      throw new SandgymError('invalid_argument', 'A container needs at least one layer: name an environment');
    }
    this.egress.check(spec.network); // a bad rule name fails before anything starts
    const sandbox = await this.createContainer(spec, options);
    if (spec.network.length === 0) return sandbox;
    try {
      await sandbox.setNetwork(spec.network);
    } catch (error) {
      await sandbox.close().catch(() => undefined);
      throw error;
    }
    return sandbox;
  }

  private createContainer(spec: SandboxSpec, options: CallOptions): Promise<ContainerSandbox> {
    const pool = this.pool;
    if (this.options.loadMode === 'tar' || spec.memorySnapshots) return this.createCold(spec, options);
    return pool.whileCreating(async () => {
      // a shell already on the node network when the tenant's rules reach beyond loopback
      const wantsVeth = spec.network.length > 0;
      const shell = pool.take(spec.qos, (s) => this.egress.isAttached(s.slot) === wantsVeth);
      if (shell) {
        try {
          await this.egress.fit(shell, spec.network);
          return await this.occupy(shell, spec);
        } catch (error) {
          this.logger.warn(
            { slot: shell.slot, error: messageOf(error) },
            'cannot use a warm shell; creating cold',
          );
          await this.launcher.teardown(shell).catch(() => undefined);
        }
      }
      return this.createCold(spec, options);
    });
  }

  /** A new container straight on the tenant's layers; its slot is the sandbox id. */
  private async createCold(spec: SandboxSpec, options: CallOptions): Promise<ContainerSandbox> {
    const unpacked = this.options.loadMode === 'tar';
    const paths = this.launcher.pathsOf(spec.id);
    // unpacked layers land in the slot's `lower`, beside the capped `rw`: they count against no cap
    let scratch: ScratchSlot;
    let points: string[];
    try {
      scratch = await this.scratch.createSlot(spec.id, mib(spec.resources.diskMib));
      await Promise.all(
        ['rw/upper', 'rw/work', 'rootfs'].map((d) => mkdir(join(paths.dir, d), { recursive: true })),
      );
      points = unpacked
        ? await this.tarballs.unpack(spec.layers, paths.dir)
        : await this.mounts.acquire(spec.layers);
    } catch (error) {
      // a layer that cannot be mounted (or unpacked) leaves no slot behind
      await rm(paths.dir, { recursive: true, force: true, maxRetries: 3 }).catch(() => undefined);
      throw error;
    }
    let shell: WarmShell;
    try {
      shell = await this.launcher.startContainer(
        spec.id,
        spec,
        this.launcher.tenantState(spec, spec.id),
        options,
        scratch,
        {
          lowers: points,
          erofs: !unpacked,
        },
      );
    } catch (error) {
      if (!unpacked) this.mounts.release(spec.layers);
      throw error;
    }
    return this.track(shell, spec, undefined, undefined, this.memory.forShell(shell, points));
  }

  /** A pooled shell: a container on the empty shared root, ready to take a tenant's layers. */
  private async createShell(qos: QosClass): Promise<WarmShell> {
    const slot = `warm-${randomBytes(8).toString('hex')}`;
    const spec: SandboxSpec = {
      id: slot,
      layers: [],
      env: {},
      workdir: '/',
      resources: SHELL_RESOURCES,
      qos,
      labels: {},
      network: [],
    };
    const scratch = await this.scratch.createSlot(slot, mib(spec.resources.diskMib));
    const shell = await this.launcher.startContainer(
      slot,
      spec,
      this.launcher.pooledState(slot),
      {},
      scratch,
      undefined,
    );
    try {
      // known now, so that taking the shell costs no lookups
      shell.agentPid = await soleProcess(shell);
      shell.pooledBaseline = baselineOf(await shell.cgroup.usage());
      await this.reuse.prepareWritableDirs(shell);
    } catch (error) {
      await this.launcher.teardown(shell).catch(() => undefined);
      throw error;
    }
    return shell;
  }

  /**
   * Gives a pooled shell the tenant's layer stack: the agent takes a fresh overlay of them as its
   * root (see agent/helper.c), and the cgroups get the tenant's limits. Counters the shell ran up
   * before are the baseline its stats start from.
   */
  private async occupy(shell: WarmShell, spec: SandboxSpec): Promise<ContainerSandbox> {
    const paths = this.launcher.pathsOf(shell.slot);
    // a pooled shell was checked to hold its agent alone when it was scrubbed, and its /dev is fresh
    const agentPid = (shell.agentPid ??= await soleProcess(shell));
    // the root swap is the only step that needs the others done; the limits, the baseline and the
    // saved state go alongside it (the shell's agent is idle, so the baseline is the same before
    // or after, and no tenant process can run before this create returns)
    let swapped = false;
    let baseline: UsageBaseline | undefined;
    const [root, limits, state] = await Promise.allSettled([
      // the agent's file requests follow its root by themselves (agent/files.c): no call needed
      this.reuse.swapInOverlay(shell, agentPid, spec.layers, '', 'keep').then(() => void (swapped = true)),
      (async () => {
        await this.reuse.applyLimits(shell, spec);
        if (shell.diskMib !== spec.resources.diskMib) {
          await this.scratch.setLimit(shell.slot, mib(spec.resources.diskMib));
          shell.diskMib = spec.resources.diskMib;
        }
      })(),
      (async () => {
        baseline = shell.pooledBaseline ?? baselineOf(await shell.cgroup.usage());
        delete shell.pooledBaseline;
        await this.launcher.saveState(paths.dir, {
          ...this.launcher.tenantState(spec, shell.slot),
          baseline,
        });
      })(),
    ]);
    for (const step of [root, limits, state]) {
      if (step.status === 'fulfilled') continue;
      // a failed swap let go of the layers itself
      if (swapped) this.mounts.release(spec.layers);
      throw step.reason;
    }
    return this.track(shell, spec, baseline);
  }

  /**
   * Puts a live sandbox of this process on a group network (a task with its docker-compose
   * services); returns its address there.
   */
  async joinGroup(sandboxId: string, group: GroupNetwork): Promise<string> {
    const sandbox = this.liveById(sandboxId);
    const shell = sandbox && this.launcher.containers.get(sandbox.slot);
    if (!shell)
      throw new SandgymError(
        'not_found',
        `No live container sandbox ${sandboxId} in this process to join a group`,
      );
    return this.egress.joinGroup(shell, group);
  }

  private track(
    shell: WarmShell,
    spec: SandboxSpec,
    baseline: UsageBaseline | undefined,
    createdAt?: number,
    memory?: ContainerMemory,
    hibernatedImage?: MemoryImage,
  ): ContainerSandbox {
    const sandbox = new ContainerSandbox({
      spec,
      slot: shell.slot,
      exited: shell.exited,
      channel: shell.channel,
      cgroup: shell.cgroup,
      upperDir: join(this.launcher.pathsOf(shell.slot).dir, 'rw', 'upper'),
      diskUsage: () => this.scratch.usage(shell.scratch),
      diskUsedNow: () => this.scratch.usedNow(shell.scratch),
      network: {
        set: async (rules) => {
          // recorded first: a successor adopting it after a crash applies what was last asked
          await this.recordRules(shell.slot, rules);
          await this.egress.set(shell, rules);
        },
        denied: () => this.egress.denied(shell.slot),
        record: () => this.egress.record(shell.slot),
        attached: () => this.egress.isAttached(shell.slot),
      },
      destroy: (s) => this.destroy(s),
      privateCopy: (upperDir) => this.privateCopy(shell.slot, upperDir, spec.layers),
      ...(baseline ? { baseline } : {}),
      ...(createdAt === undefined ? {} : { createdAt }),
      ...(memory ? { memory } : {}),
      ...(hibernatedImage ? { hibernatedImage } : {}),
      ...(this.options.beforeImage ? { beforeImage: this.options.beforeImage } : {}),
    });
    this.sandboxes.add(sandbox);
    return sandbox;
  }

  /** Notes a sandbox's current network rules in its record, for {@link adopt}. */
  private async recordRules(slot: string, rules: readonly string[]): Promise<void> {
    const dir = this.launcher.pathsOf(slot).dir;
    const state = await readContainerState(dir);
    if (!state?.spec) return;
    await this.launcher.saveState(dir, { ...state, spec: { ...state.spec, network: [...rules] } });
  }

  /**
   * Ends a tenant. Its container goes back to the warm pool when the pool wants one of its class
   * and scrubbing succeeds; otherwise it is destroyed.
   */
  private async destroy(sandbox: ContainerSandbox): Promise<void> {
    if (!sandbox.beginStop()) return;
    const shell = this.launcher.containers.get(sandbox.slot);
    const pool = this.pool;
    let releaseLater = false;
    try {
      if (shell && this.options.loadMode !== 'tar' && pool.reserve(shell.qos)) {
        if (await this.reuse.endTenant(shell)) {
          // its tenant is gone: the rest (its network made new, the root swapped back, the files
          // removed) goes on behind the caller, and only then may the shell be taken again
          releaseLater = true;
          return this.recycleLater(shell, sandbox.layers);
        }
        pool.unreserve(shell.qos);
      }
      if (shell) await this.launcher.teardown(shell);
      else await removeContainerResidue(sandbox.slot, sandbox.cgroup, this.launcher.pathsOf(sandbox.slot));
    } finally {
      if (this.options.loadMode !== 'tar' && !releaseLater) this.mounts.release(sandbox.layers);
      this.sandboxes.delete(sandbox);
      sandbox.markStopped();
    }
  }

  /**
   * Readies a shell whose tenant ended for the pool, or destroys it when that fails; the tenant's
   * layers are let go once its overlay is. The backend's close waits for it.
   */
  private recycleLater(shell: WarmShell, layers: readonly LayerImage[]): void {
    const pool = this.pool;
    const done = (async () => {
      try {
        if (await this.reuse.makeReady(shell)) return pool.put(shell, true);
        pool.unreserve(shell.qos);
        await this.launcher.teardown(shell).catch((error: unknown) => {
          this.logger.warn({ slot: shell.slot, error: messageOf(error) }, 'cannot destroy a container');
        });
      } finally {
        this.mounts.release(layers);
      }
    })();
    this.recycling.add(done);
    void done.finally(() => this.recycling.delete(done));
  }

  live(): ContainerSandbox[] {
    return [...this.sandboxes];
  }

  private liveById(id: string): ContainerSandbox | undefined {
    return [...this.sandboxes].find((s) => s.id === id);
  }

  async holds(id: string): Promise<boolean> {
    return this.liveById(id) !== undefined || (await this.records.slotOf(id)) !== undefined;
  }

  reclaimExpired(now = Date.now()): Promise<string[]> {
    return reclaimExpiredOf(this.live(), now, this.logger);
  }

  attach(id: string): ContainerSandbox {
    const mine = this.liveById(id);
    if (!mine)
      throw new SandgymError('not_found', `No live sandbox "${id}" of this process: see "sandgym ps"`);
    return mine;
  }

  async kill(id: string): Promise<void> {
    const mine = this.liveById(id);
    if (mine) return mine.close();
    const slot = (await this.records.slotOf(id)) ?? id;
    const paths = this.launcher.pathsOf(slot);
    const cgroup = SandboxCgroup.existing(this.layout, this.scope, slot);
    if (!existsSync(paths.dir) && (await cgroup.processes()).length === 0) {
      throw new SandgymError('not_found', `No sandbox "${id}" on this node: see "sandgym ps"`);
    }
    await removeContainerResidue(slot, cgroup, paths);
  }

  /**
   * Takes over the durable sandboxes a dead predecessor on this data dir left running: reopens
   * each agent's channel (two FIFOs in the sandbox's folder), resynchronises it, and makes this
   * process the owner. A sandbox whose channel does not resynchronise is left for gc.
   */
  async adopt(): Promise<ContainerSandbox[]> {
    const adopted: ContainerSandbox[] = [];
    const sandboxesDir = join(this.options.dataDir, 'sandboxes');
    for (const slot of await readdir(sandboxesDir).catch(() => [] as string[])) {
      if (this.launcher.containers.has(slot)) continue;
      const state = await readContainerState(join(sandboxesDir, slot));
      if (!state || (await isAlive(state.owner))) continue;
      // a dead predecessor's pooled shells held no tenant: nothing to adopt, only to reap
      if (state.pooled) {
        await this.reapDeadShell(slot);
        continue;
      }
      if (!state.durable || !state.spec) continue;
      try {
        adopted.push(await this.adoptOne(slot, state, state.spec));
      } catch (error) {
        this.logger.warn({ id: state.id, error: messageOf(error) }, 'cannot adopt sandbox; gc will reap it');
      }
    }
    return adopted;
  }

  private async adoptOne(
    slot: string,
    state: ContainerState,
    recorded: NonNullable<ContainerState['spec']>,
  ): Promise<ContainerSandbox> {
    const { lifetime, ...rest } = recorded;
    const spec: SandboxSpec = {
      ...rest,
      layers: recorded.layers.map((layer) => definedFields(layer) as LayerImage),
      ...(lifetime ? { lifetime: definedFields(lifetime) } : {}),
      network: recorded.network,
    };
    const paths = this.launcher.pathsOf(slot);
    const cgroup = SandboxCgroup.existing(this.layout, this.scope, slot);
    const running = (await cgroup.processes()).length > 0;
    if (!running && state.memoryImage) return this.adoptHibernated(slot, state, spec, state.memoryImage);
    if (!running) throw new Error('none of its processes is left');
    const wasFrozen = await cgroup.isFrozen();
    if (wasFrozen) await cgroup.setFrozen(false); // a frozen agent cannot answer the sync
    let channel: AgentChannel;
    try {
      channel = await this.launcher.reopenChannel(slot, ADOPT_SYNC_TIMEOUT_MS);
    } catch (error) {
      if (wasFrozen) await cgroup.setFrozen(true).catch(() => undefined);
      throw error;
    }
    await this.mounts.acquire(spec.layers);
    await this.launcher.saveState(paths.dir, { ...state, owner: this.owner });
    const scratch = await this.scratch.createSlot(slot, mib(spec.resources.diskMib));
    const shell: WarmShell = {
      slot,
      qos: spec.qos,
      channel,
      cgroup,
      exited: channel.closed,
      scratch,
      diskMib: spec.resources.diskMib,
    };
    // its links on the dead owner's networks go, and its recorded rules apply on this one's, so
    // every later SetNetwork rewrites rules this process holds
    await this.egress.isolate(shell);
    await this.egress.set(shell, spec.network);
    this.launcher.containers.set(slot, shell);
    const baseline = state.baseline;
    const sandbox = this.track(shell, spec, baseline, Date.parse(state.createdAt));
    if (wasFrozen) await sandbox.pause();
    this.logger.info({ id: state.id }, 'adopted sandbox');
    return sandbox;
  }

  /** Removes a pooled shell a dead owner left (its agent, cgroups, folder), as gc would. */
  private async reapDeadShell(slot: string): Promise<void> {
    await removeContainerResidue(
      slot,
      SandboxCgroup.existing(this.layout, this.scope, slot),
      this.launcher.pathsOf(slot),
    ).catch((error: unknown) => {
      this.logger.warn(
        { slot, error: messageOf(error) },
        'cannot reap a pooled shell of a dead owner; gc will',
      );
    });
  }

  /**
   * New containers, one per id, from a checkpoint this process's container `sourceId` made: each
   * on a snapshot of the checkpoint's files, its processes started from the checkpoint's image
   * in cgroups of its own, with the source's spec and limits. All or none.
   */
  async forkFrom(
    sourceId: string,
    checkpointId: string,
    ids: readonly string[],
    options: CallOptions = {},
  ): Promise<ContainerSandbox[]> {
    const { source, checkpoint } = checkpointOf(this.live(), sourceId, checkpointId, 'container');
    const made: ContainerSandbox[] = [];
    try {
      for (const id of ids) {
        throwIfAborted(options.signal, 'Fork');
        made.push(await this.startFromCheckpoint(checkpoint, source.specFor(id)));
      }
      return made;
    } catch (error) {
      await Promise.all(made.map((sandbox) => sandbox.close().catch(() => undefined)));
      throw error;
    }
  }

  private async startFromCheckpoint(
    checkpoint: ContainerCheckpoint,
    spec: SandboxSpec,
  ): Promise<ContainerSandbox> {
    const slot = spec.id;
    const paths = this.launcher.pathsOf(slot);
    const lowers = await this.mounts.acquire(spec.layers);
    const cgroup = new SandboxCgroup(this.layout, this.scope, slot, spec.qos);
    try {
      const scratch = await this.memory.writableLayerFrom(checkpoint, slot, spec.resources.diskMib);
      await this.launcher.saveState(paths.dir, this.launcher.tenantState(spec, slot));
      const shell: WarmShell = {
        slot,
        qos: spec.qos,
        channel: closedChannel(this.codec),
        cgroup,
        exited: Promise.resolve(),
        scratch,
        diskMib: spec.resources.diskMib,
      };
      await this.memory.startAsNew(shell, lowers, checkpoint);
      this.launcher.containers.set(slot, shell);
      await this.reuse.applyLimits(shell, spec);
      return this.track(shell, spec, undefined, undefined, this.memory.forShell(shell, lowers));
    } catch (error) {
      this.launcher.containers.delete(slot);
      await removeContainerResidue(slot, cgroup, paths).catch(() => undefined);
      this.mounts.release(spec.layers);
      throw error;
    }
  }

  /**
   * Takes over a durable sandbox that hibernated by memory image: its handle starts hibernated,
   * and its first request restores the processes from the image.
   */
  private async adoptHibernated(
    slot: string,
    state: ContainerState,
    spec: SandboxSpec,
    imageName: string,
  ): Promise<ContainerSandbox> {
    if (!this.criu.usable) throw new Error(`it hibernated by memory image, and ${this.criu.reason}`);
    const paths = this.launcher.pathsOf(slot);
    const image = await memoryImageAt(join(paths.dir, imageName));
    const lowers = await this.mounts.acquire(spec.layers);
    await this.launcher.saveState(paths.dir, { ...state, owner: this.owner });
    const scratch = await this.scratch.createSlot(slot, mib(spec.resources.diskMib));
    // no agent to talk to until the restore: a channel that is closed from the start
    const channel = closedChannel(this.codec);
    const shell: WarmShell = {
      slot,
      qos: spec.qos,
      channel,
      cgroup: new SandboxCgroup(this.layout, this.scope, slot, spec.qos),
      exited: channel.closed,
      scratch,
      diskMib: spec.resources.diskMib,
    };
    this.launcher.containers.set(slot, shell);
    const memory = this.memory.forShell(shell, lowers);
    const sandbox = this.track(shell, spec, state.baseline, Date.parse(state.createdAt), memory, image);
    this.logger.info({ id: state.id }, 'adopted hibernated sandbox');
    return sandbox;
  }

  async withWritableLayerOf<T>(
    id: string,
    consume: (
      dir: string,
      sandbox: Pick<BackendSandbox, 'layers' | 'labels'>,
      report: FilterReport,
    ) => Promise<T>,
    options: WritableLayerOptions = {},
  ): Promise<T> {
    const mine = this.liveById(id);
    if (mine) return mine.withWritableLayer((dir, report) => consume(dir, mine, report), options);
    const slot = await this.records.slotOf(id);
    const paths = this.launcher.pathsOf(slot ?? id);
    const state = slot === undefined ? undefined : await readContainerState(paths.dir);
    if (!state || slot === undefined) {
      throw new SandgymError('not_found', `No sandbox "${id}" on this node: see "sandgym ps"`);
    }
    // paths are left empty: the consumer reads digests, it does not mount
    const found = { layers: state.layers.map((digest) => ({ digest, path: '' })), labels: state.labels };
    const upper = join(paths.dir, 'rw', 'upper');
    const cgroup = SandboxCgroup.existing(this.layout, this.scope, slot);
    const wasFrozen = await cgroup.isFrozen();
    // frozen, so what it writes cannot change under the packer (or the snapshot)
    if (!wasFrozen) await cgroup.setFrozen(true);
    let copy: PrivateCopy | undefined;
    try {
      if (!options.filter) return await consume(upper, found, NOTHING_FILTERED);
      // its layers are not this process's to mount: links are resolved within the copy alone
      copy = await this.privateCopy(slot, upper, []);
    } finally {
      if (!wasFrozen) await cgroup.setFrozen(false);
    }
    // a record from before specs were kept had the usual cap
    const diskMib = state.spec?.resources.diskMib ?? SHELL_RESOURCES.diskMib;
    return consumeFiltered(copy, options.filter, diskMib, (dir, report) => consume(dir, found, report));
  }

  /**
   * A read-write snapshot of a container's `rw` subvolume beside it in its slot: what it wrote, at
   * one instant and in one ioctl, for a packer to prune (see {@link filterDiffTree}) without
   * touching the sandbox. Counts against no sandbox's cap; deleted when the packer is done.
   *
   * btrfs gives a snapshot its source's quota limit along with its data, so a copy of a sandbox
   * that filled its disk starts full: the pruner's first write (its trash folder) failed and an
   * agent's full disk turned into a grading failure. The copy is the platform's scratch, so its
   * cap is lifted before anything writes there; what it can hold is still the sandbox's own
   * writes (shared extents) plus the pruner's renames.
   */
  private async privateCopy(
    slot: string,
    upperDir: string,
    layers: readonly LayerImage[],
  ): Promise<PrivateCopy> {
    const rw = join(this.launcher.pathsOf(slot).dir, 'rw');
    const snapshot = join(this.launcher.pathsOf(slot).dir, `diff-${randomBytes(6).toString('hex')}`);
    await this.helper.snapshot(rw, snapshot);
    try {
      await this.helper.subvolume(snapshot, 'none');
    } catch (error) {
      await this.helper.deleteSubvolume(snapshot).catch(() => undefined);
      throw error;
    }
    const tree = join(snapshot, relative(rw, upperDir));
    return {
      tree,
      trash: join(snapshot, '.dropped'),
      clearOpaque: (dirs) => this.helper.clearOpaque(dirs),
      withMergedView: (consume) => this.withLayerStack(layers, consume, { above: tree }),
      dispose: () => this.helper.deleteSubvolume(snapshot),
    };
  }

  async gc(): Promise<GcReport> {
    const mine = new Set(this.launcher.containers.keys());
    const report = await this.records.sweep(mine);
    // group networks (a task's services) whose owner died without closing them
    await removeStaleGroups();
    if (mine.size === 0) await removeIdleParents(this.layout, this.scope);
    report.mounts = await this.mounts.unmountIdle();
    return report;
  }

  async list(): Promise<SandboxRecord[]> {
    return this.records.list();
  }

  async gcLayers(): Promise<{ unmounted: string[]; removedCopies: string[] }> {
    const unmounted = await this.mounts.unmountIdle();
    const removedCopies = [
      ...(await this.mounts.removeIdleCopies()),
      ...(await this.mounts.removeIdleFlatImages()),
    ];
    return { unmounted, removedCopies };
  }

  /**
   * A stack of at most `maxDepth` images for `layers`, its base flattened on this node if it is
   * deeper: for a backend that takes the images as they are (a microvm's disks).
   */
  flattenStack(layers: readonly LayerImage[], maxDepth: number): Promise<LayerImage[]> {
    return this.mounts.flattenStack(layers, maxDepth);
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    const closing = settleAll(
      [...this.sandboxes].map((s) => s.close()),
      'Some sandboxes did not close cleanly',
    );
    await closing.catch(() => undefined); // wait for every sandbox before the node-level cleanup
    // shells being readied go to the pool, and with it
    await this.recycled();
    const pooled = this.pool.close();
    await pooled.catch(() => undefined);
    this.helper.close();
    await this.mounts.unmountIdle().catch(() => undefined);
    await removeIdleParents(this.layout, this.scope);
    await this.egress.close().catch((error: unknown) => {
      this.logger.warn({ error: messageOf(error) }, 'cannot remove the node network');
    });
    await this.scratch.closeIfEmpty({ settle: this.launcher.containersMade > 0 }).catch((error: unknown) => {
      this.logger.warn({ error: messageOf(error) }, 'cannot unmount the scratch volume');
    });
    await closing;
    await pooled;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function mib(n: number): number {
  return n * 2 ** 20;
}
