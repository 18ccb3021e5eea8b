import { randomBytes, randomInt } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join, relative, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
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
  listSandboxCgroups,
  removeIdleParents,
  cgroupScope,
  cgroupLimitsOf,
  type CgroupLayout,
  type CgroupUsage,
  type UsageBaseline,
} from '../host/cgroups.ts';
import { LayerMounts } from '../host/layer-mounts.ts';
import { LayerTarballs } from '../host/layer-tarballs.ts';
import { agentBinaryPath, hostProgram } from '../host/paths.ts';
import { isAlive, processIdentity, type ProcessIdentity } from '../host/processes.ts';
import { HostHelper } from '../host/host-helper.ts';
import { raisePtyLimit } from '../host/pty-room.ts';
import { hostCanGrantSysResource } from '../host/capabilities.ts';
import { checkRuleBook, resolveRules, type NetworkRuleBook } from '../host/network-rules.ts';
import { NodeNetwork, removeStaleNetwork, type NetworkAttachment } from '../host/node-network.ts';
import { removeStaleGroups, type GroupNetwork } from '../host/group-network.ts';
import { ScratchVolume, type ScratchSlot, type VolumeRoom } from '../host/scratch-volume.ts';
import { runProgram } from '../host/run-program.ts';
import { AgentChannel } from '../internal/agent-channel.ts';
import type { AgentReady } from '../internal/agent-protocol.ts';
import { channelFifos, openPipe } from '../internal/channel-fifos.ts';
import { ContainerSandbox } from './container-sandbox.ts';
import { NOTHING_FILTERED, consumeFiltered, type PrivateCopy } from './private-copy.ts';
import type { FilterReport } from '../host/diff-filter.ts';
import { buildOciConfig } from './oci-config.ts';
import { removeContainerResidue, type ContainerPaths } from './residue.ts';
import { readContainerState, writeContainerState, type ContainerState } from './sandbox-record.ts';
import { WarmPool, type WarmPoolPolicy, type WarmShell } from './warm-pool.ts';

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
   * Sandboxes outlive this process (a node agent): after a crash, the next process on the same
   * data dir adopts them with {@link ContainerBackend.adopt}. Otherwise they end with their owner.
   */
  durable?: boolean;
  /** Warm shells kept ready per CPU class (see {@link WarmPool}); none by default. */
  warmPool?: WarmPoolPolicy;
  /** The node's named network rules, which sandboxes' policies name (see {@link NetworkRuleBook}). */
  networkRules?: NetworkRuleBook;
}

/**
 * The limits a pooled shell runs under until a tenant brings its own: a sandbox request's
 * defaults, so that most tenants need no cgroup writes at all.
 */
const SHELL_RESOURCES = { cpu: 1, memoryMib: 512, pids: 512, outputCapBytes: 1 << 20, diskMib: 10 * 1024 };

/** How long an agent may take to end a tenant's processes and take its new root. */
const RESET_TIMEOUT_MS = 10_000;

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
  readonly capabilities = CAPABILITIES;
  private readonly live = new Set<ContainerSandbox>();
  /** Every running container of this process, by slot: tenants' and pooled shells alike. */
  private readonly containers = new Map<string, WarmShell>();
  private readonly pool: WarmPool | undefined;
  private renewals = 0;
  /** Containers this process started: its close waits for their slots to go before unmounting. */
  private containersMade = 0;
  private readonly logger: Logger;
  private readonly codec: Codec;
  private isClosed = false;
  private readonly scope: string;
  /** The node network, built when the first sandbox is given egress. */
  private network: Promise<NodeNetwork> | undefined;
  /** Sandboxes on the node network, by slot. */
  private readonly egress = new Map<string, Promise<NetworkAttachment>>();
  private readonly ruleBook: NetworkRuleBook;

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
  ) {
    this.logger = (options.logger ?? silentLogger()).child({ component: 'container-backend' });
    this.codec = options.codec ?? createMsgpackCodec();
    this.scope = cgroupScope(options.dataDir);
    this.ruleBook = options.networkRules ?? {};
    checkRuleBook(this.ruleBook);
    const policy = options.warmPool ?? {};
    this.pool = Object.values(policy).some((n) => n > 0)
      ? new WarmPool(
          policy,
          { createShell: (qos) => this.createShell(qos), destroyShell: (shell) => this.teardown(shell) },
          this.logger,
        )
      : undefined;
  }

  /** The names of the node's network rules (its rule book): what builds pick their package mirrors from. */
  ruleNames(): string[] {
    return Object.keys(this.ruleBook);
  }

  /**
   * Hands `consume` a read-only view of a layer stack's merged tree on this host: a build's
   * `COPY --from` an earlier stage, or a look at its /etc/passwd. One layer is its own EROFS
   * mount; several are a read-only overlay of them, mounted on a folder of the data dir for the
   * duration (its lower dirs named relative to the mounts' folder, so a deep stack fits the
   * mount options' page).
   */
  async withLayerStack<T>(layers: readonly LayerImage[], consume: (root: string) => Promise<T>): Promise<T> {
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
      if (points.length === 1) return await consume(points[0] ?? '');
      const view = join(this.options.dataDir, 'stacks', this.stackViewName());
      await mkdir(view, { recursive: true });
      const lowers = [...points].reverse().map((point) => basename(point));
      await runProgram('mount', ['-t', 'overlay', 'overlay', '-o', `ro,lowerdir=${lowers.join(':')}`, view], {
        cwd: dirname(points[0] ?? ''),
      });
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

  /** Warm shells ready now, per CPU class. */
  get warmShells(): Record<QosClass, number> {
    return this.pool?.ready ?? { latency: 0, best_effort: 0 };
  }

  /** Resolves once the warm pool holds what its policy asks for. */
  async warmPoolFilled(timeoutMs?: number): Promise<void> {
    await this.pool?.filled(timeoutMs);
  }

  /** Durable sandboxes' state must survive a power loss; the others' only a crash of this process. */
  private saveState(dir: string, state: ContainerState): Promise<void> {
    return writeContainerState(dir, state, this.options.durable ?? false);
  }

  /** The empty, read-only root of every pooled shell: mount points and the staging dir of a root swap. */
  private get shellRoot(): string {
    return join(this.options.dataDir, 'shell-root');
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
    );
  }

  /** A container's things on the node, by slot: its sandbox id when created cold, a `warm-…` name when pooled. */
  private pathsOf(slot: string): ContainerPaths {
    return {
      dir: join(this.options.dataDir, 'sandboxes', slot),
      runtimeRoot: join(this.options.dataDir, 'runtime'),
      runtime: this.runtime,
      deleteSubvolume: (path) => this.helper.deleteSubvolume(path),
    };
  }

  async create(spec: SandboxSpec, options: CallOptions = {}): Promise<ContainerSandbox> {
    if (this.isClosed) throw new SandgymError('failed_precondition', 'The container backend is closed');
    if (spec.layers.length === 0) {
      throw new SandgymError('invalid_argument', 'A container needs at least one layer: name an environment');
    }
    resolveRules(spec.network, this.ruleBook); // a bad rule name fails before anything starts
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
    if (!pool || this.options.loadMode === 'tar') return this.createCold(spec, options);
    return pool.whileCreating(async () => {
      const shell = pool.take(spec.qos);
      if (shell) {
        try {
          return await this.occupy(shell, spec);
        } catch (error) {
          this.logger.warn(
            { slot: shell.slot, error: messageOf(error) },
            'cannot use a warm shell; creating cold',
          );
          await this.teardown(shell).catch(() => undefined);
        }
      }
      return this.createCold(spec, options);
    });
  }

  /** A new container straight on the tenant's layers; its slot is the sandbox id. */
  private async createCold(spec: SandboxSpec, options: CallOptions): Promise<ContainerSandbox> {
    const unpacked = this.options.loadMode === 'tar';
    const paths = this.pathsOf(spec.id);
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
      shell = await this.startContainer(spec.id, spec, this.tenantState(spec, spec.id), options, scratch, {
        lowers: points,
        erofs: !unpacked,
      });
    } catch (error) {
      if (!unpacked) this.mounts.release(spec.layers);
      throw error;
    }
    return this.track(shell, spec, undefined);
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
    return this.startContainer(slot, spec, this.pooledState(slot), {}, scratch, undefined);
  }

  /** The state of a shell waiting in the pool: no tenant, no layers. */
  private pooledState(slot: string): ContainerState {
    return {
      id: slot,
      slot,
      pooled: true,
      backend: 'container',
      owner: this.owner,
      createdAt: new Date().toISOString(),
      layers: [],
      labels: {},
    };
  }

  private tenantState(spec: SandboxSpec, slot: string): ContainerState {
    return {
      id: spec.id,
      slot,
      backend: 'container',
      owner: this.owner,
      createdAt: new Date().toISOString(),
      layers: spec.layers.map((l) => l.digest),
      labels: spec.labels,
      ...(this.options.durable ? { durable: true, spec } : {}),
    };
  }

  /**
   * Gives a pooled shell the tenant's layer stack: the agent takes a fresh overlay of them as its
   * root (see agent/helper.c), and the cgroups get the tenant's limits. Counters the shell ran up
   * before are the baseline its stats start from.
   */
  private async occupy(shell: WarmShell, spec: SandboxSpec): Promise<ContainerSandbox> {
    const paths = this.pathsOf(shell.slot);
    // a pooled shell was checked to hold its agent alone when it was scrubbed, and its /dev is fresh
    shell.agentPid ??= await soleProcess(shell);
    await this.swapInOverlay(shell, shell.agentPid, spec.layers, '', 'keep');
    let baseline: CgroupUsage;
    try {
      await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS });
      await this.applyLimits(shell, spec);
      if (shell.diskMib !== spec.resources.diskMib) {
        await this.scratch.setLimit(shell.slot, mib(spec.resources.diskMib));
        shell.diskMib = spec.resources.diskMib;
      }
      baseline = await shell.cgroup.usage();
      await this.saveState(paths.dir, {
        ...this.tenantState(spec, shell.slot),
        baseline: {
          cpuUsageMs: baseline.cpuUsageMs,
          oomKills: baseline.oomKills,
          pidsLimitHits: baseline.pidsLimitHits,
          memoryLimitHits: baseline.memoryLimitHits,
        },
      });
    } catch (error) {
      this.mounts.release(spec.layers);
      throw error;
    }
    return this.track(shell, spec, baseline);
  }

  /**
   * Mounts a fresh overlay of `layers` (upper and work dirs `upper<suffix>`, `work<suffix>` in
   * the slot's capped `rw` subvolume) and makes it the container's root. The layer mounts stay acquired for it; on
   * failure nothing stays acquired or created.
   */
  private async swapInOverlay(
    shell: WarmShell,
    agentPid: number,
    layers: readonly LayerImage[],
    suffix: string,
    dev: 'fresh' | 'keep',
  ): Promise<string> {
    const dir = this.pathsOf(shell.slot).dir;
    const upper = join(dir, 'rw', `upper${suffix}`);
    const work = join(dir, 'rw', `work${suffix}`);
    await Promise.all([upper, work].map((d) => mkdir(d, { recursive: true })));
    const points = await this.mounts.acquire(layers);
    try {
      // overlay lists lower dirs top first; layers come base first
      const lowers = [...points].reverse();
      await this.helper.swap(agentPid, { kind: 'overlay', lowers, upper, work, lowersAreErofs: true, dev });
      return upper;
    } catch (error) {
      this.mounts.release(layers);
      await Promise.all([upper, work].map((d) => rm(d, { recursive: true, force: true })));
      throw error;
    }
  }

  /**
   * Points a container's network at the addresses `rules` name. The first rules that allow
   * anything give it a veth on the node network; later ones only rewrite its rules (an emptied
   * policy keeps the veth, so what it still tries is counted).
   */
  private async setNetwork(shell: WarmShell, rules: readonly string[]): Promise<void> {
    const targets = resolveRules(rules, this.ruleBook);
    let attaching = this.egress.get(shell.slot);
    if (!attaching) {
      if (targets.length === 0) return;
      attaching = (async () => {
        const network = await this.nodeNetwork();
        return network.attach(shell.agentPid ?? (await soleOrFirstProcess(shell)));
      })();
      this.egress.set(shell.slot, attaching);
      attaching.catch(() => this.egress.delete(shell.slot));
    }
    const attachment = await attaching;
    await (await this.nodeNetwork()).allow(attachment, targets);
  }

  private nodeNetwork(): Promise<NodeNetwork> {
    if (!this.network) {
      const opening = NodeNetwork.open(this.options.dataDir);
      this.network = opening;
      opening.catch(() => (this.network = undefined));
    }
    return this.network;
  }

  private async deniedByRules(slot: string): Promise<number> {
    const attachment = await this.egress.get(slot)?.catch(() => undefined);
    if (!attachment || !this.network) return 0;
    return (await this.network).denied(attachment);
  }

  /**
   * Puts a live sandbox of this process on a group network (a task with its docker-compose
   * services); returns its address there.
   */
  async joinGroup(sandboxId: string, group: GroupNetwork): Promise<string> {
    const sandbox = [...this.live].find((s) => s.id === sandboxId);
    const shell = sandbox && this.containers.get(sandbox.slot);
    if (!shell)
      throw new SandgymError(
        'not_found',
        `No live container sandbox ${sandboxId} in this process to join a group`,
      );
    return group.join(shell.agentPid ?? (await soleOrFirstProcess(shell)));
  }

  /** Takes a container off the node network: back to loopback only. */
  private async detachNetwork(slot: string): Promise<void> {
    const attachment = await this.egress.get(slot)?.catch(() => undefined);
    this.egress.delete(slot);
    if (attachment && this.network) await (await this.network).detach(attachment);
  }

  /** Writes the tenant's cgroup limits, unless the container has them already. */
  private async applyLimits(shell: WarmShell, spec: SandboxSpec): Promise<void> {
    const limits = cgroupLimitsOf(spec.resources, spec.qos);
    const key = JSON.stringify(limits);
    if (shell.limits === key) return;
    await shell.cgroup.applyLimits(limits);
    shell.limits = key;
  }

  private track(
    shell: WarmShell,
    spec: SandboxSpec,
    baseline: UsageBaseline | undefined,
    createdAt?: number,
  ): ContainerSandbox {
    const sandbox = new ContainerSandbox({
      spec,
      slot: shell.slot,
      exited: shell.exited,
      channel: shell.channel,
      cgroup: shell.cgroup,
      upperDir: join(this.pathsOf(shell.slot).dir, 'rw', 'upper'),
      diskUsage: () => this.scratch.usage(shell.scratch),
      diskUsedNow: () => this.scratch.usedNow(shell.scratch),
      network: {
        set: (rules) => this.setNetwork(shell, rules),
        denied: () => this.deniedByRules(shell.slot),
        attached: () => this.egress.has(shell.slot),
      },
      destroy: (s) => this.destroy(s),
      privateCopy: (upperDir) => this.privateCopy(shell.slot, upperDir),
      ...(baseline ? { baseline } : {}),
      ...(createdAt === undefined ? {} : { createdAt }),
    });
    this.live.add(sandbox);
    return sandbox;
  }

  /**
   * Launches a container in `slot` and waits for its agent: on the tenant's overlay when `overlay`
   * is given, else on the shared empty shell root.
   */
  private async startContainer(
    slot: string,
    spec: SandboxSpec,
    state: ContainerState,
    options: CallOptions,
    scratch: ScratchSlot,
    overlay: { lowers: string[]; erofs: boolean } | undefined,
  ): Promise<WarmShell> {
    const paths = this.pathsOf(slot);
    const cgroup = new SandboxCgroup(this.layout, this.scope, slot);
    let shell: WarmShell | undefined;
    this.containersMade++;
    try {
      await this.saveState(paths.dir, state);
      const joins = await cgroup.prepare();
      const config = buildOciConfig({
        spec,
        agentHostPath: this.agentPath,
        cgroupsPath: `/${cgroup.relativePath}`,
        durable: this.options.durable ?? false,
        hostHasSysResource: this.hostHasSysResource,
        ...(overlay ? {} : { root: { path: this.shellRoot, readonly: true } }),
      });
      await writeFile(join(paths.dir, 'config.json'), JSON.stringify(config));
      await this.helper.launch({
        dir: paths.dir,
        joins,
        umount: this.layout.kind === 'v1' ? this.layout.unified : undefined,
        // overlay lists lower dirs top first; layers come base first
        overlay: overlay && { lowers: [...overlay.lowers].reverse(), erofs: overlay.erofs },
        runtime: this.runtime,
        runtimeRoot: paths.runtimeRoot,
        slot,
      });
      // the agent waits on its FIFO channel; it has no parent here to watch, so its channel
      // closing is what says it is gone
      const fifos = channelFifos(paths.dir);
      const channel = new AgentChannel(
        openPipe(fifos.requests, 'write'),
        openPipe(fifos.responses, 'read'),
        this.codec,
      );
      const exited = channel.closed;
      shell = {
        slot,
        qos: spec.qos,
        channel,
        cgroup,
        exited,
        limits: JSON.stringify(cgroupLimitsOf(spec.resources, spec.qos)),
        scratch,
        diskMib: spec.resources.diskMib,
      };
      this.containers.set(slot, shell);
      shell.agentState = (await this.waitReady(slot, channel, exited, paths, options)).state;
      this.logger.debug({ slot }, 'container ready');
      return shell;
    } catch (error) {
      if (shell) await this.teardown(shell).catch(() => undefined);
      else await removeContainerResidue(slot, cgroup, paths).catch(() => undefined);
      throw error;
    }
  }

  private async waitReady(
    slot: string,
    channel: AgentChannel,
    exited: Promise<void>,
    paths: ContainerPaths,
    options: CallOptions,
  ): Promise<AgentReady> {
    const timeoutMs = options.timeoutMs ?? this.options.startTimeoutMs ?? 30_000;
    const timeout = sleep(timeoutMs, 'timeout', { ref: false });
    const outcome = await Promise.race([
      channel.ready.then(
        () => 'ready' as const,
        () => 'exited' as const,
      ),
      exited.then(() => 'exited' as const),
      timeout,
    ]);
    if (outcome === 'ready') return channel.ready;
    const log = await readFile(join(paths.dir, 'runtime.log'), 'utf8').catch(() => '');
    const tail = log.trim().split('\n').slice(-3).join(' | ') || 'no output';
    throw new SandgymError(
      outcome === 'timeout' ? 'timeout' : 'platform_error',
      outcome === 'timeout'
        ? `Sandbox ${slot} did not become ready within ${timeoutMs} ms (raise startTimeoutMs); runtime said: ${tail}`
        : `Sandbox ${slot} failed to start: ${tail}`,
      { retryable: outcome === 'timeout' },
    );
  }

  /**
   * Ends a tenant. Its container goes back to the warm pool when the pool wants one of its class
   * and scrubbing succeeds; otherwise it is destroyed.
   */
  private async destroy(sandbox: ContainerSandbox): Promise<void> {
    if (!sandbox.beginStop()) return;
    const shell = this.containers.get(sandbox.slot);
    try {
      const pool = this.pool;
      if (shell && pool && this.options.loadMode !== 'tar' && pool.reserve(shell.qos)) {
        if (await this.scrub(shell)) return pool.put(shell, true);
        pool.unreserve(shell.qos);
      }
      if (shell) await this.teardown(shell);
      else await removeContainerResidue(sandbox.slot, sandbox.cgroup, this.pathsOf(sandbox.slot));
    } finally {
      if (this.options.loadMode !== 'tar') this.mounts.release(sandbox.layers);
      this.live.delete(sandbox);
      sandbox.markStopped();
    }
  }

  /**
   * Leaves nothing of a tenant in its container: every process ended (the agent as pid 1 kills
   * the whole pid namespace and reaps it), the cgroup checked to hold the agent alone, then the
   * empty shell root swapped in, which also brings a fresh /dev and removes every IPC object;
   * the tenant's upper dir is deleted. False when any of it fails: the caller destroys it instead.
   */
  private async scrub(shell: WarmShell): Promise<boolean> {
    try {
      await shell.cgroup.setFrozen(false);
      await this.detachNetwork(shell.slot);
      await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS });
      shell.agentPid = await soleProcess(shell);
      await this.checkAgentUnchanged(shell);
      await shell.cgroup.resetMemoryWatermark();
      await this.helper.swap(shell.agentPid, { kind: 'bind', dir: this.shellRoot });
      const paths = this.pathsOf(shell.slot);
      await removeWritableLayers(paths.dir);
      await this.saveState(paths.dir, this.pooledState(shell.slot));
      return true;
    } catch (error) {
      this.logger.warn(
        { slot: shell.slot, error: messageOf(error) },
        'cannot scrub a container for reuse; destroying it',
      );
      return false;
    }
  }

  /**
   * Fails unless the container's agent shows the process state it started with: a tenant's
   * process may have lowered its limits, reniced it or moved its CPUs (all allowed to a process
   * of the same uid), and every command of the next tenant would inherit that.
   */
  private async checkAgentUnchanged(shell: WarmShell): Promise<void> {
    const now = (await shell.channel.call({ op: 'procstate' }, { timeoutMs: RESET_TIMEOUT_MS })).state;
    if (shell.agentState === undefined || now !== shell.agentState) {
      throw new SandgymError(
        'failed_precondition',
        `The agent of container ${shell.slot} was changed by its tenant (limits, priority or CPUs): it is not reused`,
      );
    }
  }

  /** Graceful first: the agent ends every process and exits; then force. */
  private async teardown(shell: WarmShell): Promise<void> {
    try {
      await this.detachNetwork(shell.slot).catch((error: unknown) => {
        this.logger.warn(
          { slot: shell.slot, error: messageOf(error) },
          'cannot take a container off the network',
        );
      });
      await shell.cgroup.setFrozen(false).catch(() => undefined); // a frozen agent cannot exit
      await shell.channel.shutdown(2_000);
      shell.channel.fail(
        new SandgymError('failed_precondition', `Sandbox container ${shell.slot} is closed`),
      );
      const graceMs = this.options.stopGraceMs ?? 5_000;
      const exited = await Promise.race([
        shell.exited.then(() => true),
        sleep(graceMs, false, { ref: false }),
      ]);
      if (!exited) this.logger.warn({ slot: shell.slot }, 'container did not stop in time; killing it');
      await removeContainerResidue(shell.slot, shell.cgroup, this.pathsOf(shell.slot));
    } finally {
      this.containers.delete(shell.slot);
    }
  }

  /**
   * Whether a sandbox of this process holds anything beyond its image: a process besides its
   * agent, a written file, something in /dev/shm or /dev/mqueue, or an agent whose process state
   * changed. What a stateless caller (FnCall) checks between two calls before reusing the sandbox.
   */
  async holdsState(sandbox: ContainerSandbox): Promise<boolean> {
    const shell = this.containers.get(sandbox.slot);
    if (!shell) return true;
    const pids = await shell.cgroup.members();
    if (pids.length !== 1 || pids[0] === undefined) return true;
    // a call that changed its agent's process state holds state no fresh root takes away; what
    // the last command's end reported serves when nothing else was left to change it since
    const state =
      sandbox.agentStateWhenLastAlone ??
      (await shell.channel.call({ op: 'procstate' }, { timeoutMs: RESET_TIMEOUT_MS })).state;
    if (state !== shell.agentState) return true;
    const root = `/proc/${pids[0]}/root`;
    for (const dir of [sandbox.upperDir, `${root}/dev/shm`, `${root}/dev/mqueue`]) {
      if ((await readdir(dir).catch(() => ['unreadable'])).length > 0) return true;
    }
    return false;
  }

  /**
   * Gives a sandbox of this process a fresh root over its own layers, as if it were just created:
   * every process but the agent ended, a new empty upper dir, a fresh /dev, IPC purged. The
   * container, its cgroups and its agent stay. What FnCall does between calls that left state.
   * Fails when the agent's own process state was changed: no new root undoes that.
   */
  async renewRoot(sandbox: ContainerSandbox): Promise<void> {
    const shell = this.containers.get(sandbox.slot);
    if (!shell) throw new SandgymError('not_found', `No live sandbox "${sandbox.id}" of this process`);
    await shell.cgroup.setFrozen(false);
    await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS });
    shell.agentPid = await soleProcess(shell);
    await this.checkAgentUnchanged(shell);
    const upper = await this.swapInOverlay(
      shell,
      shell.agentPid,
      sandbox.layers,
      `-${++this.renewals}`,
      'fresh',
    );
    this.mounts.release(sandbox.layers); // the old root's hold is the new root's now
    const old = sandbox.upperDir;
    sandbox.rebase(upper);
    await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS }); // takes the new root
    const oldWork = join(dirname(old), basename(old).replace(/^upper/, 'work'));
    await Promise.all([old, oldWork].map((d) => rm(d, { recursive: true, force: true, maxRetries: 3 })));
  }

  /**
   * The slot of a sandbox of any process on this node: its own id when it was created cold, else
   * the warm slot whose state names it. Undefined when there is none.
   */
  private async slotOf(id: string): Promise<string | undefined> {
    if ((await readContainerState(this.pathsOf(id).dir))?.id === id) return id;
    const dir = join(this.options.dataDir, 'sandboxes');
    for (const slot of await readdir(dir).catch(() => [] as string[])) {
      if (slot.startsWith('warm-') && (await readContainerState(join(dir, slot)))?.id === id) return slot;
    }
    return undefined;
  }

  async list(): Promise<SandboxRecord[]> {
    const dir = join(this.options.dataDir, 'sandboxes');
    const records: SandboxRecord[] = [];
    for (const slot of await readdir(dir).catch(() => [] as string[])) {
      const state = await readContainerState(join(dir, slot));
      if (!state || state.pooled) continue;
      const cgroup = new SandboxCgroup(this.layout, this.scope, slot);
      const alive = await isAlive(state.owner);
      records.push({
        id: state.id,
        backend: 'container',
        state: !alive ? 'orphaned' : (await cgroup.isFrozen()) ? 'paused' : 'running',
        ownerPid: state.owner.pid,
        createdAt: state.createdAt,
        labels: state.labels,
        layers: state.layers,
      });
    }
    return records;
  }

  /** The sandboxes this process holds. */
  liveSandboxes(): ContainerSandbox[] {
    return [...this.live];
  }

  attach(id: string): ContainerSandbox {
    const mine = [...this.live].find((s) => s.id === id);
    if (!mine)
      throw new SandgymError('not_found', `No live sandbox "${id}" of this process: see "sandgym ps"`);
    return mine;
  }

  async kill(id: string): Promise<void> {
    const mine = [...this.live].find((s) => s.id === id);
    if (mine) return mine.close();
    const slot = (await this.slotOf(id)) ?? id;
    const paths = this.pathsOf(slot);
    const cgroup = new SandboxCgroup(this.layout, this.scope, slot);
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
      if (this.containers.has(slot)) continue;
      const state = await readContainerState(join(sandboxesDir, slot));
      if (!state?.durable || !state.spec || state.pooled || (await isAlive(state.owner))) continue;
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
    const paths = this.pathsOf(slot);
    const cgroup = new SandboxCgroup(this.layout, this.scope, slot);
    if ((await cgroup.processes()).length === 0) throw new Error('none of its processes is left');
    const wasFrozen = await cgroup.isFrozen();
    if (wasFrozen) await cgroup.setFrozen(false); // a frozen agent cannot answer the sync
    const fifos = channelFifos(paths.dir);
    const channel = new AgentChannel(
      openPipe(fifos.requests, 'write'),
      openPipe(fifos.responses, 'read'),
      this.codec,
      { resyncMarker: randomBytes(16), firstId: 1 + randomInt(1 << 30) },
    );
    try {
      await channel.sync(ADOPT_SYNC_TIMEOUT_MS);
    } catch (error) {
      channel.fail(new SandgymError('agent_crash', 'adoption failed'));
      if (wasFrozen) await cgroup.setFrozen(true).catch(() => undefined);
      throw error;
    }
    await this.mounts.acquire(spec.layers);
    await this.saveState(paths.dir, { ...state, owner: this.owner });
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
    this.containers.set(slot, shell);
    const baseline = state.baseline;
    const sandbox = this.track(shell, spec, baseline, Date.parse(state.createdAt));
    if (wasFrozen) await sandbox.pause();
    this.logger.info({ id: state.id }, 'adopted sandbox');
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
    const mine = [...this.live].find((s) => s.id === id);
    if (mine) return mine.withWritableLayer((dir, report) => consume(dir, mine, report), options);
    const slot = await this.slotOf(id);
    const paths = this.pathsOf(slot ?? id);
    const state = slot === undefined ? undefined : await readContainerState(paths.dir);
    if (!state || slot === undefined) {
      throw new SandgymError('not_found', `No sandbox "${id}" on this node: see "sandgym ps"`);
    }
    // paths are left empty: the consumer reads digests, it does not mount
    const found = { layers: state.layers.map((digest) => ({ digest, path: '' })), labels: state.labels };
    const upper = join(paths.dir, 'rw', 'upper');
    const cgroup = new SandboxCgroup(this.layout, this.scope, slot);
    const wasFrozen = await cgroup.isFrozen();
    // frozen, so what it writes cannot change under the packer (or the snapshot)
    if (!wasFrozen) await cgroup.setFrozen(true);
    let copy: PrivateCopy | undefined;
    try {
      if (!options.filter) return await consume(upper, found, NOTHING_FILTERED);
      copy = await this.privateCopy(slot, upper);
    } finally {
      if (!wasFrozen) await cgroup.setFrozen(false);
    }
    return consumeFiltered(copy, options.filter, (dir, report) => consume(dir, found, report));
  }

  /**
   * A read-write snapshot of a container's `rw` subvolume beside it in its slot: what it wrote, at
   * one instant and in one ioctl, for a packer to prune (see {@link filterDiffTree}) without
   * touching the sandbox. Counts against no sandbox's cap; deleted when the packer is done.
   */
  private async privateCopy(slot: string, upperDir: string): Promise<PrivateCopy> {
    const rw = join(this.pathsOf(slot).dir, 'rw');
    const snapshot = join(this.pathsOf(slot).dir, `diff-${randomBytes(6).toString('hex')}`);
    await this.helper.snapshot(rw, snapshot);
    return {
      tree: join(snapshot, relative(rw, upperDir)),
      trash: join(snapshot, '.dropped'),
      clearOpaque: (dirs) => this.helper.clearOpaque(dirs),
      dispose: () => this.helper.deleteSubvolume(snapshot),
    };
  }

  async gc(): Promise<GcReport> {
    const report: GcReport = { sandboxes: [], mounts: [], cgroups: [] };
    const sandboxesDir = join(this.options.dataDir, 'sandboxes');
    const mine = new Set(this.containers.keys());
    for (const slot of await readdir(sandboxesDir).catch(() => [] as string[])) {
      if (mine.has(slot)) continue;
      const state = await readContainerState(join(sandboxesDir, slot));
      if (state && (await isAlive(state.owner))) continue;
      await removeContainerResidue(
        slot,
        new SandboxCgroup(this.layout, this.scope, slot),
        this.pathsOf(slot),
      );
      if (!state?.pooled) report.sandboxes.push(state?.id ?? slot);
    }
    // cgroups whose sandbox folder is gone: a crash between the two removals
    for (const id of await listSandboxCgroups(this.layout, this.scope)) {
      if (mine.has(id) || existsSync(join(sandboxesDir, id))) continue;
      const cgroup = new SandboxCgroup(this.layout, this.scope, id);
      await removeContainerResidue(id, cgroup, this.pathsOf(id));
      report.cgroups.push(...cgroup.allPaths());
    }
    await this.removeOrphanRuntimeState(mine);
    await this.removeStackViews();
    // group networks (a task's services) whose owner died without closing them
    await removeStaleGroups();
    if (mine.size === 0) await removeIdleParents(this.layout, this.scope);
    report.mounts = await this.mounts.unmountIdle();
    return report;
  }

  /** Read-only stack views a build of a dead process left mounted (see withLayerStack). */
  private async removeStackViews(): Promise<void> {
    const dir = join(this.options.dataDir, 'stacks');
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      const [pid, startTime] = name.split('-').map(Number);
      if (pid !== undefined && startTime !== undefined && (await isAlive({ pid, startTime }))) continue;
      await runProgram('umount', [join(dir, name)]).catch(() => undefined);
      await rm(join(dir, name), { recursive: true, force: true }).catch(() => undefined);
    }
  }

  async gcLayers(): Promise<{ unmounted: string[]; removedCopies: string[] }> {
    const unmounted = await this.mounts.unmountIdle();
    return { unmounted, removedCopies: await this.mounts.removeIdleCopies() };
  }

  private async removeOrphanRuntimeState(mine: Set<string>): Promise<void> {
    const root = join(this.options.dataDir, 'runtime');
    for (const id of await readdir(root).catch(() => [] as string[])) {
      if (mine.has(id) || existsSync(this.pathsOf(id).dir)) continue;
      await runProgram(this.runtime, ['--root', root, 'delete', '--force', id]).catch((error: unknown) => {
        this.logger.warn({ id, error: messageOf(error) }, 'cannot delete orphaned runtime state');
      });
    }
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    const closing = settleAll(
      [...[...this.live].map((s) => s.close()), this.pool?.close() ?? Promise.resolve()],
      'Some sandboxes did not close cleanly',
    );
    await closing.catch(() => undefined); // wait for every sandbox before the node-level cleanup
    this.helper.close();
    await this.mounts.unmountIdle().catch(() => undefined);
    await removeIdleParents(this.layout, this.scope);
    await this.closeNetwork().catch((error: unknown) => {
      this.logger.warn({ error: messageOf(error) }, 'cannot remove the node network');
    });
    await this.scratch.closeIfEmpty({ settle: this.containersMade > 0 }).catch((error: unknown) => {
      this.logger.warn({ error: messageOf(error) }, 'cannot unmount the scratch volume');
    });
    await closing;
  }

  /** The node network goes with the last sandbox; one a crashed predecessor left goes too. */
  private async closeNetwork(): Promise<void> {
    if (this.network) return (await this.network).close();
    await removeStaleNetwork(this.options.dataDir);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** A pid in the container's network namespace: its agent, found when the shell does not know it. */
async function soleOrFirstProcess(shell: WarmShell): Promise<number> {
  const [pid] = await shell.cgroup.members();
  if (pid === undefined)
    throw new SandgymError('failed_precondition', `Container ${shell.slot} has no process left`);
  return pid;
}

/** The host pid of a container's agent, when it is the only process left: the check that a scrub worked. */
async function soleProcess(shell: WarmShell): Promise<number> {
  const pids = await shell.cgroup.members();
  if (pids.length !== 1 || pids[0] === undefined) {
    throw new SandgymError(
      'platform_error',
      `Container ${shell.slot} holds ${pids.length} processes, not its agent alone`,
    );
  }
  return pids[0];
}

function mib(n: number): number {
  return n * 2 ** 20;
}

/** Removes every upper and work dir of a container's folder (a renewed root leaves numbered ones). */
async function removeWritableLayers(dir: string): Promise<void> {
  const rw = join(dir, 'rw');
  const names = (await readdir(rw)).filter((name) => /^(upper|work)(-\d+)?$/.test(name));
  await Promise.all(names.map((name) => rm(join(rw, name), { recursive: true, force: true, maxRetries: 3 })));
}
