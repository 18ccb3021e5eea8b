import { access, rm } from 'node:fs/promises';
import { resolve, join } from 'node:path';
import {
  ContainerBackend,
  GroupNetwork,
  BACKEND_NAMES,
  FnCallBackend,
  defaultDataDir,
  prepareDataFolder,
  isAlive,
  processIdentity,
  type ProcessIdentity,
  defaultRuleBook,
  type NetworkRuleBook,
  type CallOptions,
  type GcReport,
  type LayerVerification,
  type LoadMode,
  type SandboxRecord,
  type WarmPoolPolicy,
  type QosClass,
  type BackendName,
  type BackendSandbox,
  type FilterReport,
  type SandboxLifetime,
  callOptionsOf,
} from '../backends/index.ts';
import { BackendRegistry } from './backend-registry.ts';
import { RUNTIME_FILES, writeRuntimeFiles } from './runtime-files.ts';
import {
  SandgymError,
  abortable,
  createMsgpackCodec,
  definedFields,
  messageOf,
  newSandboxId,
  nodeOfSandboxId,
  parseAt,
  silentLogger,
  type Logger,
} from '../common/index.ts';
import { DEFAULT_TRAJECTORY_CAP_BYTES, TrajectoryLog } from './trajectory-log.ts';
import { DEFAULT_TRAJECTORY_RETENTION_MS, removeExpiredTrajectories } from './trajectory-retention.ts';
import { SandboxSteps } from './steps/sandbox-steps.ts';
import type { HostPlatform, SandboxGroupNetwork } from './host-platform.ts';
import type { StepReply, StepRequest } from './steps/step-types.ts';
import { forkSandbox, sandboxGroup } from './fork.ts';
import { DEFAULT_PROJECT, PROJECT_LABEL, RUN_LABEL, RunManager, type Run, type RunOptions } from './runs.ts';
import { localRun, runOptionsSchema } from './run-handles.ts';
import { RemotePlatform, type ConnectOptions } from './remote-platform.ts';
import { localStepLog, type StepLog } from './exactly-once.ts';
import { LayerStore, parseEnvironmentRef, type Environment, type ProjectStore } from './store/layer-store.ts';
import { LayerPins, PIN_REFRESH_MS, pinIsLive } from './store/layer-pins.ts';
import type {
  ForkOptions,
  LayerGcOptions,
  LayerGcReport,
  PackDiffOptions,
  PackDiffResult,
  Sandbox,
  SandboxGroup,
} from './platform-client.ts';
import {
  DEFAULT_DISK_MIB,
  sandboxRequestSchema,
  type ResolvedSandboxRequest,
  type SandboxRequest,
} from './sandbox-request.ts';
import {
  buildFromDockerfile,
  resolveImage,
  type BuildHost,
  type DockerfileBuildOptions,
  type DockerfileBuildResult,
} from './layer-build/dockerfile-build.ts';
import type { RegistryOptions } from './layer-build/from-registry.ts';

const MIB = 2 ** 20;
/** Below this much free space on the node's sandbox volume, no new container is admitted. */
const VOLUME_FREE_FLOOR_BYTES = 256 * MIB;

/** How often idle TTLs and deadlines are checked. */
const LIFETIME_SWEEP_MS = 250;
/** The most copies one memory fork makes: each is a whole VM started from the checkpoint. */
const MAX_MEMORY_FORKS = 64;

/** Options for {@link Platform.local}. */
export interface LocalPlatformOptions {
  /** Node data: sandboxes, layer mounts, runtime state. @default {@link defaultDataDir}() */
  dataDir?: string;
  /** The layer store. @default $SANDGYM_STORE, else `<dataDir>/store` */
  storeDir?: string;
  logger?: Logger;
  /** How layers reach this node: `ondemand`, `eager` or `tar`. @default 'ondemand' */
  loadMode?: LoadMode;
  /** What is checked before mounting a layer: `digest` or `size`. @default 'digest' */
  verifyLayers?: LayerVerification;
  /** The node's name, which every sandbox id carries. @default 'local' */
  nodeId?: string;
  /**
   * Sandboxes outlive this process, for a successor on the same data dir to adopt with
   * {@link LocalPlatform.adoptSandboxes} (node agents). @default false: they end with it
   */
  durable?: boolean;
  /**
   * Warm container shells kept ready per CPU class, so creates skip container start-up; a
   * destroyed sandbox's container is scrubbed and reused while the pool is short. @default none
   */
  warmPool?: WarmPoolPolicy;
  /**
   * The node's named network rules (`{"mirror:debian": ["10.1.2.3:80"]}`) that sandboxes'
   * policies name. @default the JSON file $SANDGYM_NET_RULES names, else the host's package
   * mirrors (`mirror:debian`, `mirror:npm`, `dns`; see defaultRuleBook), which builds reach.
   */
  networkRules?: NetworkRuleBook;
  /**
   * The cluster's control plane, which no sandbox's rules ever reach whatever they name:
   * `IP[/N][:PORT]` (that network on every port, and the port everywhere) or `:PORT` (controllers,
   * etcd, other nodes' ports). Beyond it, the guard always refuses the host itself, loopback,
   * link-local and metadata, sandbox subnets, broadcast, multicast and IPv6. A node agent adds its
   * own ports and etcd. @default the comma-separated list in $SANDGYM_CONTROL_PLANE, else none
   */
  controlPlane?: string[];
  /**
   * What a sandbox's trajectory log may grow to, or its sandbox's disk cap if that is less. Its
   * first seven eighths hold records whole; past them records keep only the head of long outputs
   * and the step's signals say `log`; a step that would leave no room for its record does not
   * run and ends the episode (scored). @default 256 MiB
   */
  trajectoryCapBytes?: number;
  /**
   * How long the trajectory log of a sandbox that ended stays for `sandgym audit` (a run's end
   * removes its sandboxes' logs at once). @default 7 days
   */
  trajectoryRetentionMs?: number;
  /**
   * The project this platform's own sandboxes, environments and layers belong to (a node agent
   * acts for each caller's instead). @default $SANDGYM_PROJECT, else `default`
   */
  project?: string;
  /**
   * The most each project may hold in the layer store: the layers it makes (diffs, checkpoints,
   * builds) and its environments. Past it, what the project made that nothing needs is collected,
   * and if that is not enough, packing is refused (retryable). @default no limit: the embedded
   * platform's one user owns the disk (`sandgym node` sets 16 GiB, --max-store-mib)
   */
  maxStoreBytes?: number;
  /**
   * How long a layer this platform just made (a grader's diff, a build step) or is about to mount
   * stays out of every layer gc's reach while nothing references it yet. @default 10 minutes
   */
  freshLayerHoldMs?: number;
  /**
   * How Dockerfile builds find FROM images the store lacks (registry credentials, plain-HTTP
   * registries) and the base to build on instead when one cannot be had. @default from
   * $SANDGYM_REGISTRY_AUTH_FILE, $SANDGYM_INSECURE_REGISTRIES (comma-separated hosts) and
   * $SANDGYM_FALLBACK_BASE; without a fallback, such a FROM fails the build.
   */
  images?: ImageSources;
  /**
   * The idle TTL of sandboxes outside a run that set none (`lifetime.idleTtlMs`): after this long
   * without a request the node reclaims them, as if they had asked for it. A crashed client that
   * held no run leaves its sandboxes behind, and nothing else ends them. A run's sandboxes are
   * its lease's. @default none: the embedded platform's sandboxes end with their process
   * (`sandgym node` sets 24 hours, `--idle-ttl`)
   */
  defaultIdleTtlMs?: number;
}

/** A private network a group of sandboxes shares (see {@link LocalPlatform.createGroupNetwork}). */
/** Where FROM images come from when the store lacks them. */
export interface ImageSources {
  registry?: RegistryOptions;
  /** The environment to build on when a FROM image is neither stored nor pullable; reported. */
  fallbackBase?: string;
}

/** {@link ImageSources} from the environment variables that {@link LocalPlatformOptions.images} names. */
export function imageSourcesFromEnv(
  /** Settings given on a command line: they win over the variables, insecure hosts add to them. */
  given: {
    authFile?: string | undefined;
    insecureRegistries?: string[];
    fallbackBase?: string | undefined;
  } = {},
  env: NodeJS.ProcessEnv = process.env,
): ImageSources {
  const authFile = given.authFile ?? env['SANDGYM_REGISTRY_AUTH_FILE'];
  const insecure = [
    ...(env['SANDGYM_INSECURE_REGISTRIES'] ?? '').split(',').filter(Boolean),
    ...(given.insecureRegistries ?? []),
  ];
  const fallbackBase = given.fallbackBase ?? env['SANDGYM_FALLBACK_BASE'];
  return {
    registry: {
      ...(authFile ? { authFile } : {}),
      ...(insecure.length ? { insecureRegistries: insecure } : {}),
    },
    ...(fallbackBase ? { fallbackBase } : {}),
  };
}

/** The project an embedded platform acts for when not told otherwise: $SANDGYM_PROJECT, else `default`. */
export function defaultProject(): string {
  return process.env['SANDGYM_PROJECT'] ?? DEFAULT_PROJECT;
}

/** Where the layer store is when not told otherwise. */
export function defaultStoreDir(dataDir: string): string {
  return resolve(process.env['SANDGYM_STORE'] ?? join(dataDir, 'store'));
}

/** The embedded platform: every component in this process, no servers. */
export class LocalPlatform implements HostPlatform {
  private isClosed = false;
  private readonly codec = createMsgpackCodec();
  private readonly trajectories = new Map<string, Promise<TrajectoryLog>>();
  /** The step runner of each sandbox that took a step through this platform. */
  private readonly stepRunners = new Map<string, Promise<SandboxSteps>>();

  /** The store as this platform's own project sees it (see {@link storeFor}). */
  readonly store: ProjectStore;
  /** What this process needs kept in the store, for every node's layer gc. */
  private readonly pins: LayerPins;
  private readonly pinRefresh: NodeJS.Timeout;

  constructor(
    readonly dataDir: string,
    /** The whole layer store, every project's. */
    readonly layers: LayerStore,
    private readonly container: ContainerBackend,
    private readonly logger: Logger,
    /** The runs of this node: leases, phases, cleanup. */
    readonly runManager: RunManager,
    identity: ProcessIdentity,
    readonly project = DEFAULT_PROJECT,
    readonly nodeId = 'local',
    private readonly trajectoryCapBytes = DEFAULT_TRAJECTORY_CAP_BYTES,
    private readonly trajectoryRetentionMs = DEFAULT_TRAJECTORY_RETENTION_MS,
    freshLayerHoldMs?: number,
    /** Where builds find FROM images the store lacks, and the fallback base if one was asked for. */
    private readonly images: ImageSources = {},
    /** Each project's store quota (see LocalPlatformOptions.maxStoreBytes). */
    private readonly maxStoreBytes?: number,
    private readonly defaultIdleTtlMs?: number,
  ) {
    this.lifetimes = setInterval(() => void this.reclaimExpired(), LIFETIME_SWEEP_MS);
    this.lifetimes.unref();
    this.registry = new BackendRegistry(container, new FnCallBackend(container, { logger, nodeId }), {
      dataDir,
      guestDir: join(layers.root, 'guest'),
      logger,
      debianMirror: process.env['SANDGYM_DEBIAN_MIRROR'] ?? 'http://deb.debian.org/debian',
    });
    this.pins = new LayerPins(
      layers,
      identity,
      async () => (await this.listSandboxes()).flatMap((record) => record.layers),
      freshLayerHoldMs,
    );
    this.pinRefresh = setInterval(() => {
      this.pins
        .refresh()
        .catch((error: unknown) => this.logger.warn({ err: error }, 'cannot refresh layer pins'));
    }, PIN_REFRESH_MS);
    this.pinRefresh.unref();
    this.store = this.storeFor(project);
  }

  /**
   * The store as `project` sees it: its environments over the shared ones, its layers pinned
   * while fresh, what it makes held to `maxStoreBytes` (the platform's quota unless a controller's
   * grant gives the call its own). What a node agent uses for each caller.
   */
  storeFor(project: string, maxStoreBytes = this.maxStoreBytes): ProjectStore {
    return this.layers.forProject(
      project,
      (digest) => this.pins.hold([digest]),
      maxStoreBytes === undefined
        ? undefined
        : {
            maxBytes: maxStoreBytes,
            makeRoom: () => this.collectLayers(project, 0, false).then(() => undefined),
          },
    );
  }

  /** Every backend of this node: containers, FnCall on warm container workers, microVMs, VMs. */
  private readonly registry: BackendRegistry;

  /** The kinds of sandbox this platform creates. */
  readonly backends: readonly BackendName[] = BACKEND_NAMES;

  /**
   * Warm shells ready now per CPU class, a wait for the pool to reach its policy, a wait for the
   * containers of closed sandboxes to be back in it (a close returns once its tenant is gone; the
   * container is readied for the next behind it), and a way to raise the policy (a batch sizes
   * the pool to its concurrency; see evaluate).
   */
  get warmPool(): {
    ready: Record<QosClass, number>;
    filled(timeoutMs?: number): Promise<void>;
    recycled(): Promise<void>;
    grow(policy: WarmPoolPolicy): void;
  } {
    const container = this.container;
    return {
      ready: container.warmShells,
      filled: (timeoutMs) => container.warmPoolFilled(timeoutMs),
      recycled: () => container.recycled(),
      grow: (policy) => container.growWarmPool(policy),
    };
  }

  private readonly lifetimes: NodeJS.Timeout;

  /**
   * Reclaims sandboxes of every backend whose idle TTL or hard deadline has passed, closes the
   * trajectory logs of sandboxes that ended, and now and then removes logs past their retention.
   */
  private async reclaimExpired(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      await this.registry.reclaimExpired();
      await this.closeEndedTrajectories();
      if (Date.now() - this.retentionSweptAt >= Math.min(60_000, this.trajectoryRetentionMs / 4)) {
        this.retentionSweptAt = Date.now();
        await this.removeExpiredTrajectories();
      }
    } catch (error) {
      this.logger.warn({ err: error }, 'cannot sweep sandbox lifetimes');
    } finally {
      this.sweeping = false;
    }
  }

  /** A sweep still running (a VM takes a while to stop) is not started again over it. */
  private sweeping = false;
  private retentionSweptAt = 0;

  /** Closes the trajectory logs (and forgets the step runners) of sandboxes no longer live here. */
  private async closeEndedTrajectories(): Promise<void> {
    if (this.trajectories.size === 0) return;
    const live = new Set((await this.registry.live()).map((sandbox) => sandbox.id));
    for (const [id, log] of this.trajectories) {
      if (live.has(id)) continue;
      const steps = await this.stepRunners.get(id)?.catch(() => undefined);
      if (steps?.busy) continue;
      this.trajectories.delete(id);
      this.stepRunners.delete(id);
      await (await log.catch(() => undefined))?.close();
    }
  }

  /** Removes the logs of sandboxes this node no longer has, once past the retention. */
  private async removeExpiredTrajectories(): Promise<void> {
    const keep = new Set([...this.trajectories.keys(), ...(await this.registry.list()).map((r) => r.id)]);
    const removed = await removeExpiredTrajectories(
      join(this.dataDir, 'trajectories'),
      keep,
      this.trajectoryRetentionMs,
    );
    if (removed.length)
      this.logger.info({ sandboxes: removed }, 'trajectory logs past their retention removed');
  }

  /** Starts (or rejoins) a run of this platform's project. */
  startRun(options: RunOptions): Promise<Run> {
    return this.startRunFor(this.project, options);
  }

  /** Starts (or rejoins) a run of `project` on this node. */
  async startRunFor(project: string, options: RunOptions): Promise<Run> {
    const valid = parseAt(runOptionsSchema, options, 'run options');
    await this.runManager.start(project, valid);
    return localRun(this.runManager, project, valid.name);
  }

  /**
   * Puts a sandbox's trajectory log on the disk: the barrier before its state is made to outlive
   * the host (see TrajectoryLog). A log this process had not opened may hold what a node process
   * before it wrote and never synced (it stayed in the page cache): opened, it knows none of its
   * bytes to be on the disk, so its sync covers them.
   */
  async syncTrajectory(sandboxId: string): Promise<void> {
    const path = join(this.dataDir, 'trajectories', `${sandboxId}.log`);
    // never stepped: no log to sync, and none to make
    const stepped =
      this.trajectories.has(sandboxId) ||
      (await access(path).then(
        () => true,
        () => false,
      ));
    if (!stepped) return;
    await (await this.trajectory(sandboxId)).sync();
  }

  /** Closes and deletes a sandbox's trajectory log (its run ended). */
  async dropTrajectory(sandboxId: string): Promise<void> {
    const log = this.trajectories.get(sandboxId);
    this.trajectories.delete(sandboxId);
    this.stepRunners.delete(sandboxId);
    await (await log?.catch(() => undefined))?.close();
    await rm(join(this.dataDir, 'trajectories', `${sandboxId}.log`), { force: true });
  }

  createSandbox(request: SandboxRequest = {}, options: CallOptions = {}): Promise<Sandbox> {
    return this.createSandboxFor(this.project, request, options);
  }

  /** The handles of this process's live sandboxes, of every backend (what runs govern). */
  liveSandboxes(): Promise<BackendSandbox[]> {
    return this.registry.live();
  }

  /** A sandbox owned by `project` (node agents create on behalf of their callers' projects). */
  async createSandboxFor(
    project: string,
    request: SandboxRequest,
    options: CallOptions = {},
  ): Promise<BackendSandbox> {
    if (this.isClosed) throw new SandgymError('failed_precondition', 'The platform is closed');
    const resolved = parseAt(sandboxRequestSchema, request, 'sandbox request');
    if (resolved.run) this.runManager.require(project, resolved.run);
    resolved.labels = {
      ...resolved.labels,
      [PROJECT_LABEL]: project,
      ...(resolved.run ? { [RUN_LABEL]: resolved.run } : {}),
    };
    if (resolved.backend === 'fncall' && resolved.run) {
      throw new SandgymError(
        'invalid_argument',
        'A FnCall sandbox keeps no state for a run to govern: leave out "run", or use backend "container", "microvm" or "vm"',
      );
    }
    // the environment and every layer stacked over it are ones the project may use
    const store = this.storeFor(project);
    const named = await store.getEnvironment(resolved.environment);
    for (const digest of resolved.extraLayers ?? []) await store.requireLayer(digest);
    const environment = resolved.extraLayers?.length
      ? { ...named, layers: [...named.layers, ...resolved.extraLayers] }
      : named;
    return this.launch(environment, resolved, options);
  }

  /** A sandbox on an explicit layer stack: what a Dockerfile build runs its RUN steps in. */
  createSandboxFromLayers(
    layers: string[],
    config: Environment['config'],
    options: { network?: string[]; resources?: SandboxRequest['resources'] } = {},
  ): Promise<BackendSandbox> {
    const resolved = parseAt(
      sandboxRequestSchema,
      { resources: options.resources ?? { memoryMib: 2048 }, network: options.network ?? [] },
      'sandbox request',
    );
    const stack: Environment = { name: 'build', version: 'step', layers, config, description: '' };
    // a build step's stack is no stored environment: its sandbox carries no environment label
    return this.launch(stack, resolved, { stored: false });
  }

  /** A sandbox's lifetime: what it asked for, and the default idle TTL outside a run. */
  private lifetimeOf(resolved: ResolvedSandboxRequest): { lifetime?: SandboxLifetime } {
    const asked = resolved.lifetime ? definedFields(resolved.lifetime) : {};
    const idleTtlMs = asked.idleTtlMs ?? (resolved.run === undefined ? this.defaultIdleTtlMs : undefined);
    const lifetime: SandboxLifetime = { ...asked, ...(idleTtlMs ? { idleTtlMs } : {}) };
    return Object.keys(lifetime).length > 0 ? { lifetime } : {};
  }

  private async launch(
    environment: Environment,
    resolved: ResolvedSandboxRequest,
    options: CallOptions & { stored?: boolean },
  ): Promise<BackendSandbox> {
    const id = newSandboxId(this.nodeId);
    this.logger.debug({ id, environment: `${environment.name}:${environment.version}` }, 'creating sandbox');
    const labels: Record<string, string> = { ...resolved.labels };
    if (options.stored !== false) labels['environment'] = `${environment.name}:${environment.version}`;
    const backend = await this.registry.get(resolved.backend);
    const diskMib = await this.admitDisk(resolved.backend, resolved.resources.diskMib);
    // pinned before they are mounted: no layer gc may take them from under this create
    await this.pins.hold(environment.layers);
    const sandbox = await backend.create(
      {
        id,
        layers: await this.layers.layerImages(environment),
        env: { ...environment.config.env, ...resolved.env },
        workdir: resolved.workdir ?? environment.config.workdir,
        resources: { ...resolved.resources, diskMib },
        qos: resolved.qos,
        labels,
        network: resolved.network,
        ...this.lifetimeOf(resolved),
        // a run's sandboxes hibernate when it is preempted
        ...(resolved.run ? { memorySnapshots: true } : {}),
      },
      callOptionsOf(options),
    );
    // A build step's sandbox commits its whole writable layer, so it gets none; a FnCall worker
    // keeps no files between calls.
    if (options.stored === false || resolved.backend === 'fncall') return sandbox;
    try {
      await writeRuntimeFiles(sandbox);
    } catch (error) {
      await sandbox.close().catch(() => undefined);
      throw error;
    }
    return sandbox;
  }

  /**
   * A container's disk cap, admitted against the node's sandbox volume: by default the usual cap
   * or what the volume holds, whichever is less; a cap the volume could never hold is refused for
   * good, and no sandbox starts on a volume that is all but full (its neighbours would then share
   * nothing but ENOSPC). VMs keep their own disks beside the node's data.
   */
  private async admitDisk(backend: BackendName, asked: number | undefined): Promise<number> {
    if (backend === 'microvm' || backend === 'vm') return asked ?? DEFAULT_DISK_MIB;
    let room = await this.container.diskRoom();
    const capacityMib = Math.floor(room.capacityBytes / MIB);
    const diskMib = asked ?? Math.min(DEFAULT_DISK_MIB, capacityMib);
    if (diskMib > capacityMib) {
      throw new SandgymError(
        'resource_exhausted',
        `resources.diskMib ${diskMib} is more than node ${this.nodeId}'s sandbox volume holds (${capacityMib} MiB): ask for less`,
      );
    }
    const floor = Math.min(VOLUME_FREE_FLOOR_BYTES, room.capacityBytes * 0.1);
    // what sandboxes that just ended held is freed lazily: free it before calling the volume full
    if (room.freeBytes < floor) room = await this.container.reclaimDisk();
    if (room.freeBytes < floor) {
      throw new SandgymError(
        'admission_rejected',
        `Node ${this.nodeId}'s sandbox volume is full: retry when sandboxes end, or on another node`,
        { retryable: true },
      );
    }
    return diskMib;
  }

  /** A read-only view of a layer stack's merged tree on this host (see ContainerBackend.withLayerStack). */
  async withLayerStack<T>(layers: readonly string[], consume: (root: string) => Promise<T>): Promise<T> {
    return this.container.withLayerStack(await this.layers.imagesOf(layers), consume);
  }

  /**
   * The network rules a Dockerfile's RUN steps reach unless a build names its own: the node's
   * package mirrors (its rule book's `mirror:*` rules) and its `dns` rule, where it has them.
   */
  get defaultBuildNetwork(): string[] {
    return this.container.ruleNames().filter((name) => name.startsWith('mirror:') || name === 'dns');
  }

  /**
   * Keeps every sandbox's network off more of the cluster's control plane, from the next packet
   * on: endpoints as `IP[/N][:PORT]`, `:PORT` or a URL (see controlPlaneOf). What a node agent
   * tells its platform about itself (its ports, its etcd) and what its operator lists.
   */
  guardControlPlane(endpoints: readonly string[]): Promise<void> {
    return this.container.guardControlPlane(endpoints);
  }

  /** An image by reference, from the store or its registry (or the fallback base), as FROM finds it. */
  resolveImage(image: string): Promise<{ environment: Environment; notes: string[] }> {
    return this.resolveImageFor(this.project, image);
  }

  /** {@link resolveImage} into `project`'s view of the store. */
  resolveImageFor(project: string, image: string): Promise<{ environment: Environment; notes: string[] }> {
    return resolveImage(this.storeFor(project), image, this.imageSettings());
  }

  /** Builds with the platform's registry settings and fallback base unless the build names its own. */
  buildFromDockerfile(options: DockerfileBuildOptions): Promise<DockerfileBuildResult> {
    return buildFromDockerfile(this, { ...this.imageSettings(), ...options });
  }

  /** {@link buildFromDockerfile} into `project`'s view of the store (its step cache and environments). */
  buildFromDockerfileFor(project: string, options: DockerfileBuildOptions): Promise<DockerfileBuildResult> {
    const host: BuildHost = {
      store: this.storeFor(project),
      createSandboxFromLayers: (layers, config, more) => this.createSandboxFromLayers(layers, config, more),
      withLayerStack: (layers, consume) => this.withLayerStack(layers, consume),
      defaultBuildNetwork: this.defaultBuildNetwork,
    };
    return buildFromDockerfile(host, { ...this.imageSettings(), ...options });
  }

  private imageSettings(): Pick<DockerfileBuildOptions, 'registry' | 'fromFallback'> {
    const { registry, fallbackBase } = this.images;
    return { ...(registry ? { registry } : {}), ...(fallbackBase ? { fromFallback: fallbackBase } : {}) };
  }

  listSandboxes(): Promise<SandboxRecord[]> {
    return this.registry.list();
  }

  /** Adopts the durable sandboxes a crashed predecessor on this data dir left running. */
  adoptSandboxes(): Promise<BackendSandbox[]> {
    return this.registry.adopt();
  }

  async attachSandbox(id: string): Promise<BackendSandbox> {
    return (await this.registry.ownerOf(id)).attach(id);
  }

  async killSandbox(id: string): Promise<void> {
    return (await this.registry.ownerOf(id)).kill(id);
  }

  /**
   * A private network for a group of this platform's container sandboxes (a task and its
   * docker-compose services): members reach each other on it and nothing else through it.
   * Close it when the group ends; a crashed owner's is removed by {@link gc}.
   */
  async createGroupNetwork(): Promise<SandboxGroupNetwork> {
    const group = await GroupNetwork.create();
    return {
      join: (sandbox) => {
        if (sandbox.backend !== 'container')
          throw new SandgymError(
            'unsupported',
            `Only container sandboxes join a group network, not ${sandbox.backend}`,
          );
        return this.container.joinGroup(sandbox.id, group);
      },
      leave: (address) => group.leave(address),
      close: () => group.close(),
    };
  }

  /** Reaps what dead owners left on this node, every project's: sandboxes, mounts, cgroups. */
  gc(): Promise<GcReport> {
    return this.registry.gc();
  }

  /**
   * {@link gc} as `project` may do it: its own sandboxes whose owner died. The node's residue
   * (mounts, cgroups, other projects' sandboxes) stays for its operator's gc.
   */
  async gcFor(project: string): Promise<GcReport> {
    const orphans = (await this.listSandboxes()).filter(
      (record) => record.state === 'orphaned' && record.labels[PROJECT_LABEL] === project,
    );
    for (const { id } of orphans) await this.killSandbox(id);
    return { sandboxes: orphans.map((record) => record.id), mounts: [], cgroups: [] };
  }

  async layerGc(options: LayerGcOptions = {}): Promise<LayerGcReport> {
    return this.layerGcFor(options.allProjects ? undefined : this.project, options);
  }

  /**
   * Layer gc as `project` may do it (see LayerStore.collectGarbage): its own layers only, and
   * none that an environment of any project references or any process sharing the store pinned.
   * Without a project, the node's admin collects every project's.
   */
  /**
   * Layer gc for `project` (every project's when undefined). Unmounting idle layer mounts and
   * sweeping the store's scratch folders are node-wide: only the node's operator (`nodeWide`) does
   * them, and only their report names other projects' layers and the node's paths.
   */
  async layerGcFor(
    project: string | undefined,
    options: LayerGcOptions & { nodeWide?: boolean } = {},
  ): Promise<LayerGcReport> {
    const nodeWide = options.nodeWide ?? true;
    const node = nodeWide ? await this.container.gcLayers() : { unmounted: [], removedCopies: [] };
    const store = await this.collectLayers(project, options.minAgeMs ?? 60 * 60_000, nodeWide);
    return { ...node, removedLayers: store.removed, freedBytes: store.freedBytes };
  }

  /** The store's part of {@link layerGcFor}: what nothing references or pins, older than `minAgeMs`. */
  private async collectLayers(
    project: string | undefined,
    minAgeMs: number,
    sweepScratch: boolean,
  ): Promise<{ removed: string[]; freedBytes: number }> {
    await this.pins.refresh();
    const pinned = new Set([...this.pins.current(), ...(await this.layers.livePins(pinIsLive(isAlive)))]);
    return this.layers.collectGarbage({
      minAgeMs,
      pinned,
      sweepScratch,
      ...(project === undefined ? {} : { owner: project }),
    });
  }

  listEnvironments(): Promise<Environment[]> {
    return this.store.listEnvironments();
  }

  getEnvironment(ref: string): Promise<Environment> {
    return this.store.getEnvironment(ref);
  }

  /**
   * {@link PlatformClient.packDiff}; `maxStoreBytes` is the sandbox's project's store quota for
   * this call, where a controller's grant sets one (default the platform's own).
   */
  async packDiff(
    sandbox: Sandbox | string,
    options: PackDiffOptions & { maxStoreBytes?: number },
  ): Promise<PackDiffResult> {
    const ref = options.name === undefined ? undefined : parseEnvironmentRef(options.name);
    const id = typeof sandbox === 'string' ? sandbox : sandbox.id;
    // Always a private copy, pruned: what a layer cannot hold (too-long names and paths), what no
    // layer should (FIFOs, sockets, devices), the excluded paths and whatever stands in for them,
    // links into hidden paths.
    const filter = {
      // what the runtime writes at each start is no sandbox's work, as `docker commit` leaves it
      excludePaths: [...RUNTIME_FILES, ...(options.excludePaths ?? [])],
      ...(options.reportPaths ? { reportPaths: options.reportPaths } : {}),
      ...(options.hiddenPaths ? { hiddenPaths: options.hiddenPaths } : {}),
      ...(options.excludeRegexes ? { excludeRegexes: options.excludeRegexes } : {}),
    };
    const pack = async (dir: string, found: Pick<Sandbox, 'layers' | 'labels'>, report: FilterReport) => {
      // what a sandbox is packed into belongs to the sandbox's project, and counts in its quota
      const store = this.storeFor(
        found.labels[PROJECT_LABEL] ?? this.project,
        options.maxStoreBytes ?? this.maxStoreBytes,
      );
      return {
        store,
        present: report.present,
        dropped: report.dropped,
        excludedByPattern: report.excludedByPattern,
        excludedByPatternCut: report.excludedByPatternCut,
        layer: await store.addLayerFromDirectory(dir, `pack_diff of sandbox ${id}`),
        parent: found.labels['environment'],
        stack: found.layers.map((l) => l.digest),
      };
    };
    const { store, layer, present, dropped, excludedByPattern, excludedByPatternCut, parent, stack } = await (
      await this.registry.ownerOf(id)
    ).withWritableLayerOf(id, pack, {
      ...definedFields({ signal: options.signal, timeoutMs: options.timeoutMs }),
      filter,
    });
    if (!ref) return { layer, present, dropped, excludedByPattern, excludedByPatternCut };
    const handle = typeof sandbox === 'string' ? undefined : sandbox;
    const config = parent ? (await store.getEnvironment(parent)).config : {};
    const environment = await store.putEnvironment({
      ...ref,
      layers: [...stack, layer.digest],
      config,
      description: options.description ?? `${parent ?? 'sandbox'} + changes of ${id}`,
    });
    // a snapshot of a run's sandbox belongs to the run: its end removes it
    if (handle) await this.runManager.addSnapshot(handle, `${environment.name}:${environment.version}`);
    return { layer, environment, present, dropped, excludedByPattern, excludedByPatternCut };
  }

  /**
   * The trajectory log of a sandbox on this node (`<dataDir>/trajectories/<id>.log`), one handle
   * per sandbox shared by every client in this process.
   */
  trajectory(sandboxId: string): Promise<TrajectoryLog> {
    nodeOfSandboxId(sandboxId);
    let log = this.trajectories.get(sandboxId);
    if (!log) {
      log = TrajectoryLog.open(
        join(this.dataDir, 'trajectories', `${sandboxId}.log`),
        this.codec,
        this.trajectoryCapBytes,
      );
      this.trajectories.set(sandboxId, log);
    }
    return log;
  }

  async stepLog(sandboxId: string): Promise<StepLog> {
    return localStepLog(await this.trajectory(sandboxId));
  }

  /**
   * One step of an episode in a sandbox of this node, exactly once (see SandboxSteps): run,
   * audited and recorded here, in one call. The caller's signal stops its wait, not the step.
   */
  async step(sandbox: Sandbox, request: StepRequest, options: CallOptions = {}): Promise<StepReply> {
    let steps = this.stepRunners.get(sandbox.id);
    if (!steps) {
      steps = this.trajectory(sandbox.id).then((log) => {
        // the node keeps no more of a sandbox's log than the sandbox may write
        log.lowerCap(sandbox.resources.diskMib * MIB);
        return new SandboxSteps(sandbox, log);
      });
      this.stepRunners.set(sandbox.id, steps);
    }
    return abortable((await steps).step(request), options.signal, 'The step');
  }

  async fork(sandbox: Sandbox, count: number, options: ForkOptions = {}): Promise<SandboxGroup> {
    if (options.depth !== 'memory') return forkSandbox(this, sandbox, count, options);
    return sandboxGroup(await this.forkInMemory(sandbox.id, count, options));
  }

  /**
   * `count` sandboxes on this node that carry on from a checkpoint of sandbox `id` (a fresh one,
   * or `options.checkpoint`): its processes, memory and files, its resources, labels and run.
   * All or none.
   */
  async forkInMemory(
    id: string,
    count: number,
    options: CallOptions & Pick<ForkOptions, 'checkpoint'> = {},
  ): Promise<BackendSandbox[]> {
    const backend = await this.registry.ownerOf(id);
    const source = backend.attach(id);
    if (!backend.forkFrom) {
      throw new SandgymError(
        'unsupported',
        `A ${backend.name} sandbox cannot be forked at memory depth; fork it at depth 'disk' (its files), or use a container, microvm or vm`,
      );
    }
    if (!Number.isInteger(count) || count < 1 || count > MAX_MEMORY_FORKS)
      throw new SandgymError('invalid_argument', `count must be 1 to ${MAX_MEMORY_FORKS}, got ${count}`);
    const given = options.checkpoint;
    const checkpointId =
      given === undefined
        ? (await source.checkpoint(callOptionsOf(options))).id
        : typeof given === 'string'
          ? given
          : given.id;
    // pinned before the copies mount them, as for any create
    await this.pins.hold(source.layers.map((layer) => layer.digest));
    const ids = Array.from({ length: count }, () => newSandboxId(this.nodeId));
    return backend.forkFrom(id, checkpointId, ids, callOptionsOf(options));
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    try {
      clearInterval(this.lifetimes);
      clearInterval(this.pinRefresh);
      this.runManager.close();
      await this.registry.close();
    } finally {
      for (const log of this.trajectories.values()) await (await log.catch(() => undefined))?.close();
      await this.pins.close().catch(() => undefined);
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Entry points to a platform. */
export const Platform = {
  /**
   * The embedded platform: sandboxes run on this host, driven from this process.
   *
   * @example
   * ```ts
   * await using platform = await Platform.local();
   * await using sandbox = await platform.createSandbox({ environment: 'debian:bookworm' });
   * const result = await sandbox.exec(['python3', '-c', 'print(6*7)']);
   * ```
   */
  async local(options: LocalPlatformOptions = {}): Promise<LocalPlatform> {
    // checked before anything is made in them (see prepareDataFolder), and root's alone
    const dataDir = await prepareDataFolder(
      options.dataDir ?? defaultDataDir(),
      'dataDir or $SANDGYM_DATA_DIR',
    );
    const logger = (options.logger ?? silentLogger()).child({ component: 'platform' });
    const storeDir = await prepareDataFolder(
      options.storeDir ?? defaultStoreDir(dataDir),
      'storeDir or $SANDGYM_STORE',
    );
    const layers = await LayerStore.open(storeDir);
    // the backend and the run manager are made first, and reach the platform once it exists
    const late: { platform?: LocalPlatform } = {};
    const container = await ContainerBackend.create({
      dataDir,
      logger,
      ...(options.loadMode ? { loadMode: options.loadMode } : {}),
      ...(options.verifyLayers ? { verifyLayers: options.verifyLayers } : {}),
      ...(options.durable ? { durable: true } : {}),
      // a log that cannot be synced keeps the sandbox from an image (it hibernates by reclaim)
      beforeImage: async (id) => {
        await late.platform?.syncTrajectory(id).catch((error: unknown) => {
          logger.error({ id, error: messageOf(error) }, 'not hibernating to an image: its log cannot sync');
          throw error;
        });
      },
      ...(options.warmPool ? { warmPool: options.warmPool } : {}),
      networkRules: options.networkRules ?? (await defaultRuleBook()),
      controlPlane:
        options.controlPlane ?? (process.env['SANDGYM_CONTROL_PLANE'] ?? '').split(',').filter(Boolean),
    });
    const runs = await RunManager.open(
      join(dataDir, 'runs.json'),
      {
        live: () => late.platform?.liveSandboxes() ?? Promise.resolve(container.live()),
        destroy: (sandbox) => sandbox.close(),
        dropLog: (id) => late.platform?.dropTrajectory(id) ?? Promise.resolve(),
        dropSnapshot: (project, environment) => layers.forProject(project).removeEnvironment(environment),
      },
      logger,
    );
    const identity = await processIdentity(process.pid);
    if (!identity) throw new SandgymError('platform_error', "Cannot read this process's identity from /proc");
    late.platform = new LocalPlatform(
      dataDir,
      layers,
      container,
      logger,
      runs,
      identity,
      options.project ?? defaultProject(),
      options.nodeId,
      options.trajectoryCapBytes,
      options.trajectoryRetentionMs,
      options.freshLayerHoldMs,
      options.images ?? imageSourcesFromEnv(),
      options.maxStoreBytes,
      options.defaultIdleTtlMs,
    );
    return late.platform;
  },

  /**
   * The cluster client: the same interface, over gRPC to a controller (`grpc://host:port`).
   *
   * @example
   * ```ts
   * await using platform = await Platform.connect('grpc://controller:7443', { token });
   * ```
   */
  connect(url: string, options: ConnectOptions): Promise<RemotePlatform> {
    return RemotePlatform.connect(url, options);
  },
};
