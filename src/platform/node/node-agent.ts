import { totalmem } from 'node:os';
import { SandgymError, definedFields, type Logger } from '../../common/index.ts';
import {
  grantedRules,
  type BackendSandbox,
  type ExecOptions,
  type LoadMode,
  type NetworkGrant,
  type SandboxCheckpoint,
} from '../../backends/index.ts';
import type { LocalPlatform } from '../local-platform.ts';
import type { SandboxRequest } from '../sandbox-request.ts';
import type { StepRequest } from '../steps/step-types.ts';
import { PROJECT_LABEL } from '../runs.ts';
import { MemoryAdmission } from './memory-admission.ts';
import { sandboxRequestSchema } from '../sandbox-request.ts';
import {
  DEFAULT_IN_FLIGHT_BYTES,
  NODE,
  RUNS,
  RequestBudget,
  SANDBOXES,
  WireServer,
  register,
  checkTokenStrength,
  tokenAuthenticator,
  quotaOf,
  networkGrantOf,
  storeQuotaOf,
  type CallContext,
  type DrainProgress,
  type ExecRequest,
  type IdResolvers,
  type TlsFiles,
  type NodeStatus,
  type Registration,
  type SandboxInfo,
} from '../wire/index.ts';
import { NodeProjectClient } from './node-project-client.ts';
import { drainProgress } from './drain.ts';
import { NodeClusterLink, type NodeEtcdOptions } from '../etcd/node-cluster-link.ts';
import { NodeMetrics } from '../metrics/node-metrics.ts';
import { serveMetrics, type MetricsServer } from '../metrics/metrics-server.ts';

/** Options for {@link NodeAgent.start}. */
export interface NodeAgentOptions {
  /** host:port to listen on; port 0 picks a free one. */
  listen: string;
  /** The token controllers (and direct clients) present. */
  token: string;
  /** Most sandboxes this node runs at once. */
  maxSandboxes?: number;
  /** Memory the node gives sandboxes, in MiB. Default: the host's. */
  memoryCapacityMib?: number;
  /** How far measured use plus headroom may exceed the capacity. Default 1.5. */
  overcommit?: number;
  /** Host memory that must stay free, in MiB. Default 256. */
  freeFloorMib?: number;
  logger: Logger;
  loadMode?: LoadMode;
  /** More services to serve beside the node's own (the Envs service, from the env layer). */
  services?: (agent: NodeAgent) => ServedService[];
  /** Serve over mutual TLS: callers must present a certificate this CA signed. */
  tls?: TlsFiles;
  /** Join the cluster through etcd: membership under a lease, and quotas kept there. */
  etcd?: NodeEtcdOptions;
  /** Where to serve Prometheus metrics, at /metrics (see serveMetrics): `PORT` is loopback's. */
  metricsListen?: string;
  /** The bearer token a scrape must present; required to serve metrics beyond loopback. */
  metricsToken?: string;
  /**
   * Most bytes of request bodies one project's calls may hold at once on this node; more is
   * refused unread, retryable. @default 256 MiB
   */
  maxInFlightBytes?: number;
  /**
   * Most bytes of request bodies all projects' calls may hold at once (a holder of the node token
   * names any project). @default four times {@link maxInFlightBytes}
   */
  maxInFlightTotalBytes?: number;
}

/** etcd's peer port, by convention: the node knows etcd's client endpoints only. */
const ETCD_PEER_PORT = 2380;

/** Why admission said no, as the metrics label it. */
type Refusal = 'draining' | 'full' | 'memory' | 'quota';

/** A service a node serves for a layer above it, closed when the node closes. */
export interface ServedService {
  registration: Registration;
  close(): Promise<void>;
  /**
   * Per project, sandboxes it is owed but holds none of now (an env between episodes): the node
   * reports them with the project's live ones, so a controller's quota counts them.
   */
  reserved?(): Record<string, number>;
}

/**
 * What a controller passed with the call that made a project's in-process client, held for
 * every sandbox that client makes: the project's quota (enforced with etcd) and its network
 * grant. Neither: the caller held the node token as the node's operator.
 */
export interface ProjectLimits {
  quota?: number | undefined;
  network?: NetworkGrant | undefined;
}

interface Owned {
  sandbox: BackendSandbox;
  project: string;
}

/** How often the node measures its sandboxes' memory for admission. */
const MEASURE_EVERY_MS = 1_000;

/**
 * The node agent: serves this host's sandboxes over gRPC. It owns their handles, trajectory logs
 * and layer mounts (through its embedded platform), and has the final say on admission: short of
 * capacity, it refuses with a retryable `admission_rejected` so the controller places elsewhere.
 */
export class NodeAgent {
  private readonly owned = new Map<string, Owned>();
  /** Admitted creates still starting. */
  private pending = 0;
  private creates = 0;
  private closed = false;
  private readonly measuring: NodeJS.Timeout;
  private readonly served: ServedService[] = [];
  private draining = false;
  private cluster: NodeClusterLink | undefined;
  private metricsServer: MetricsServer | undefined;
  readonly metrics: NodeMetrics;

  private constructor(
    readonly nodeId: string,
    private readonly platform: LocalPlatform,
    private readonly maxSandboxes: number,
    private readonly memory: MemoryAdmission,
    private server: WireServer | undefined,
    private readonly logger: Logger,
  ) {
    this.measuring = setInterval(() => void this.measure(), MEASURE_EVERY_MS);
    this.measuring.unref();
    this.metrics = new NodeMetrics(nodeId, {
      sandboxes: () => [...this.owned.values()].map(({ sandbox }) => sandbox),
      memory: () => ({
        committedMib: this.memory.requestedMib,
        chargedMib: this.memory.chargedMib,
        measuredMib: this.memory.measuredMib,
        capacityMib: Math.floor(this.memory.policy.capacityMib * this.memory.policy.overcommit),
      }),
      draining: () => this.draining,
    });
  }

  /** Refreshes what each sandbox uses, for admission by measured use. */
  private async measure(): Promise<void> {
    for (const [id, { sandbox }] of this.owned) {
      const stats = await sandbox.stats().catch(() => undefined);
      if (stats) this.memory.measured(id, stats.memoryBytes / 1024 / 1024);
    }
  }

  /**
   * Starts serving. Sandboxes a crashed predecessor left running on the same data dir are adopted
   * first (with their trajectory logs, which live on disk), and true orphans are destroyed.
   */
  static async start(platform: LocalPlatform, options: NodeAgentOptions): Promise<NodeAgent> {
    checkTokenStrength(options.token, 'The node token (SANDGYM_NODE_TOKEN)');
    // the guard knows the control plane before a sandbox can be given egress through this node
    await platform.guardControlPlane(
      controlPlaneOf(options, [portOf(options.listen), portOf(options.metricsListen)]),
    );
    const memory = new MemoryAdmission({
      capacityMib: options.memoryCapacityMib ?? Math.floor(totalmem() / 1024 / 1024),
      overcommit: options.overcommit ?? 1.5,
      freeFloorMib: options.freeFloorMib ?? 256,
      headroom: 0.25,
    });
    const agent = new NodeAgent(
      platform.nodeId,
      platform,
      options.maxSandboxes ?? 256,
      memory,
      undefined,
      options.logger.child({ component: 'node-agent', node: platform.nodeId }),
    );
    for (const sandbox of await platform.adoptSandboxes()) {
      agent.owned.set(sandbox.id, { sandbox, project: sandbox.labels[PROJECT_LABEL] ?? 'default' });
      memory.admit(sandbox.id, sandbox.resources.memoryMib);
    }
    const reaped = await platform.gc();
    if (agent.owned.size || reaped.sandboxes.length) {
      agent.logger.info(
        { adopted: agent.owned.size, reaped: reaped.sandboxes.length },
        'recovered sandboxes',
      );
    }
    agent.server = await WireServer.listen(
      options.listen,
      [
        agent.sandboxService(),
        agent.runService(),
        agent.nodeService(),
        ...(options.services?.(agent) ?? []).map((served) => {
          agent.served.push(served);
          return served.registration;
        }),
      ],
      {
        authenticate: tokenAuthenticator({ [options.token]: 'default' }, { trustProjectHeader: true }),
        resolvers: agent.idResolvers(),
        budget: nodeRequestBudget(options),
        logger: agent.logger,
        ...(options.tls ? { tls: options.tls } : {}),
      },
    );
    agent.logger.info({ port: agent.server.port, tls: Boolean(options.tls) }, 'node agent listening');
    try {
      if (options.metricsListen)
        agent.metricsServer = await serveMetrics(
          options.metricsListen,
          agent.metrics.registry,
          agent.logger,
          options.metricsToken,
        );
      // ports picked at start (port 0) are known only now
      await platform.guardControlPlane(
        controlPlaneOf(options, [agent.server.port, agent.metricsServer?.port ?? 0]),
      );
      if (options.etcd) agent.cluster = await agent.joinCluster(options.etcd, options.listen);
    } catch (error) {
      await agent.close();
      throw error;
    }
    return agent;
  }

  /** Registers in etcd and counts the sandboxes it adopted against their projects' quotas. */
  private joinCluster(options: NodeEtcdOptions, listen: string): Promise<NodeClusterLink> {
    const status = this.status();
    return NodeClusterLink.join(
      options,
      {
        nodeId: this.nodeId,
        address: options.advertise ?? `${advertisedHost(listen)}:${this.port}`,
        backends: status.backends,
        capacity: status.capacity,
        memoryCapacityMib: status.memoryCapacityMib,
        draining: this.draining,
      },
      [...this.owned].map(([id, { project }]) => ({ id, project })),
      this.platform.runManager,
      this.logger,
    );
  }

  /** The port /metrics is served on (with `metricsListen`). */
  get metricsPort(): number {
    if (!this.metricsServer)
      throw new SandgymError(
        'failed_precondition',
        'The node agent serves no metrics: give it metricsListen',
      );
    return this.metricsServer.port;
  }

  /** The port it listens on (useful with port 0). */
  get port(): number {
    if (!this.server) throw new SandgymError('failed_precondition', 'The node agent is not listening');
    return this.server.port;
  }

  /** Drops sandboxes that are gone without a Destroy call (a run's cleanup, a lease expiry). */
  private prune(): void {
    for (const [id, { sandbox }] of this.owned) if (sandbox.state === 'stopped') void this.forget(id);
  }

  /** What controllers' watchers see. */
  status(): NodeStatus {
    this.prune();
    const projects: Record<string, number> = {};
    for (const { project } of this.owned.values()) projects[project] = (projects[project] ?? 0) + 1;
    for (const served of this.served)
      for (const [project, count] of Object.entries(served.reserved?.() ?? {}))
        projects[project] = (projects[project] ?? 0) + count;
    return {
      nodeId: this.nodeId,
      backends: [...this.platform.backends],
      healthy: !this.closed && !this.draining,
      draining: this.draining,
      sandboxes: this.owned.size,
      capacity: this.maxSandboxes,
      memoryCommittedMib: this.memory.chargedMib,
      memoryCapacityMib: Math.floor(this.memory.policy.capacityMib * this.memory.policy.overcommit),
      projects,
    };
  }

  /**
   * How this node looks up the ids a request carries, for the caller's project, before any
   * handler runs: its sandboxes by owner, the store by the project's view of it, runs by project.
   * The same lookups guard the node's in-process clients (served envs), which skip the wire.
   */
  private idResolvers(): IdResolvers {
    return {
      sandbox: (id, { project }) => this.projectSandbox(project, id),
      layer: (digest, { project }) => this.platform.storeFor(project).requireLayer(digest),
      environment: (ref, { project }) => this.platform.storeFor(project).getEnvironment(ref),
      run: (name, { project }) => this.platform.runManager.resolve(project, name),
    };
  }

  private runService() {
    const runs = this.platform.runManager;
    return register(RUNS, {
      StartRun: (request, call) => runs.start(call.principal.project, request),
      RenewLease: ({ name }, call) => runs.renew(call.principal.project, name),
      SetPhase: ({ name, phase, expectedMs }, call) =>
        runs.setPhase(call.principal.project, name, phase, expectedMs === undefined ? {} : { expectedMs }),
      EndRun: async ({ name }, call) => {
        const report = await runs.end(call.principal.project, name);
        await Promise.all(report.destroyed.map((id) => this.forget(id)));
        return report;
      },
    });
  }

  private nodeService() {
    return register(NODE, {
      Status: () => Promise.resolve(this.status()),
      Drain: ({ hibernateIdle }, call) => this.drain(hibernateIdle, call.signal),
      Undrain: async () => {
        await this.setDraining(false);
        return this.status();
      },
    });
  }

  private async setDraining(draining: boolean): Promise<void> {
    if (this.draining === draining) return;
    this.draining = draining;
    this.logger.info({ draining }, draining ? 'draining: no new sandboxes' : 'taking sandboxes again');
    await this.cluster?.setDraining(draining, this.logger);
  }

  /** Stops placement here, then reports what is still running until nothing is (see {@link drainProgress}). */
  private async *drain(hibernateIdle: boolean, signal: AbortSignal): AsyncGenerator<DrainProgress> {
    await this.setDraining(true);
    yield* drainProgress(
      () => {
        this.prune();
        return [...this.owned.values()].map(({ sandbox }) => sandbox);
      },
      { hibernateIdle, signal, logger: this.logger },
    );
  }

  private sandboxService() {
    return register(SANDBOXES, {
      Create: async ({ request }, call) =>
        info(
          await this.create(call.principal.project, request, {
            signal: call.signal,
            quota: quotaOf(call.metadata),
            network: networkGrantOf(call.metadata),
          }),
        ),
      Describe: ({ sandboxId }, call) => Promise.resolve(info(this.sandboxOf(sandboxId, call))),
      Exec: (request, call) => this.exec(request, call),
      ExecCollected: (request, call) => {
        const { sandboxId, argv, options } = execArguments(request, call);
        return this.sandboxOf(sandboxId, call).exec(argv, options);
      },
      ReadFile: async ({ sandboxId, path, maxBytes, user }, call) => ({
        data: await this.sandboxOf(sandboxId, call).readFile(path, {
          signal: call.signal,
          ...(maxBytes === undefined ? {} : { maxBytes }),
          ...(user === undefined ? {} : { user }),
        }),
      }),
      WriteFile: async ({ sandboxId, path, data, mode, user }, call) => {
        await this.sandboxOf(sandboxId, call).writeFile(path, data, {
          signal: call.signal,
          ...(mode === undefined ? {} : { mode }),
          ...(user === undefined ? {} : { user }),
        });
        return {};
      },
      ListDir: async ({ sandboxId, path, user }, call) => {
        const entries = await this.sandboxOf(sandboxId, call).listDir(path, {
          signal: call.signal,
          ...(user === undefined ? {} : { user }),
        });
        return { entries: [...entries], ...(entries.truncated ? { truncated: true } : {}) };
      },
      Pause: async ({ sandboxId }, call) => {
        await this.sandboxOf(sandboxId, call).pause({ signal: call.signal });
        return {};
      },
      Resume: async ({ sandboxId }, call) => {
        await this.sandboxOf(sandboxId, call).resume({ signal: call.signal });
        return {};
      },
      Hibernate: ({ sandboxId }, call) => this.sandboxOf(sandboxId, call).hibernate({ signal: call.signal }),
      Checkpoint: ({ sandboxId }, call) =>
        this.sandboxOf(sandboxId, call).checkpoint({ signal: call.signal }),
      RestoreCheckpoint: async ({ sandboxId, checkpointId }, call) => {
        await this.sandboxOf(sandboxId, call).restore(checkpointId, { signal: call.signal });
        return {};
      },
      ForkInMemory: async ({ sandboxId, count, checkpointId }, call) => {
        const copies = await this.forkInMemory(call.principal.project, sandboxId, count, {
          signal: call.signal,
          quota: quotaOf(call.metadata),
          ...(checkpointId ? { checkpoint: checkpointId } : {}),
        });
        return { sandboxes: copies.map(info) };
      },
      Stats: ({ sandboxId }, call) => this.sandboxOf(sandboxId, call).stats({ signal: call.signal }),
      WrittenPaths: async ({ sandboxId, prefixes, limit }, call) => ({
        paths: await this.sandboxOf(sandboxId, call).writtenPaths(prefixes, {
          signal: call.signal,
          ...(limit ? { limit } : {}),
        }),
      }),
      SetNetwork: async ({ sandboxId, rules }, call) => {
        const sandbox = this.sandboxOf(sandboxId, call);
        const granted = withinGrant(rules, networkGrantOf(call.metadata), call.principal.project);
        await sandbox.setNetwork(granted, { signal: call.signal });
        return {};
      },
      Destroy: async ({ sandboxId }, call) => {
        await this.destroy(sandboxId, call.principal.project);
        return {};
      },
      List: async (_request, call) => ({
        sandboxes: (await this.platform.listSandboxes()).filter(
          (record) => record.labels[PROJECT_LABEL] === call.principal.project,
        ),
      }),
      PackDiff: ({ sandboxId, ...options }, call) => {
        // a controller passes the project's store quota when its grant sets one
        const maxStoreBytes = storeQuotaOf(call.metadata);
        return this.platform.packDiff(this.sandboxOf(sandboxId, call), {
          ...definedFields(options),
          ...(maxStoreBytes === undefined ? {} : { maxStoreBytes }),
          signal: call.signal,
        });
      },
      // each project sees its own environments over the shared ones, and no other project's
      ListEnvironments: async (_request, call) => ({
        environments: await this.platform.storeFor(call.principal.project).listEnvironments(),
      }),
      GetEnvironment: ({ ref }, call) => this.platform.storeFor(call.principal.project).getEnvironment(ref),
      Step: async ({ sandboxId, ...request }, call) => {
        const sandbox = this.sandboxOf(sandboxId, call);
        const timer = this.metrics.stepSeconds.startTimer();
        try {
          const reply = await this.platform.step(sandbox, definedFields(request) as StepRequest, {
            signal: call.signal,
          });
          timer({ outcome: 'ok' });
          return reply;
        } catch (error) {
          timer({ outcome: 'error' });
          throw error;
        }
      },
      Trajectory: async ({ sandboxId }, call) => ({
        records: [...(await (await this.stepLogOf(sandboxId, call)).records())],
      }),
      // node-wide for its operator; a tenant reaps its own project's residue only
      Gc: (_request, call) =>
        call.principal.isOperator ? this.platform.gc() : this.platform.gcFor(call.principal.project),
      // a project collects only what it made, never what another's sandboxes or graders use
      LayerGc: ({ minAgeMs }, call) =>
        this.platform.layerGcFor(call.principal.project, {
          nodeWide: call.principal.isOperator,
          ...(minAgeMs === undefined ? {} : { minAgeMs }),
        }),
    });
  }

  /**
   * A sandbox for `project`, admitted here. With a `network` grant (a controller's call), the
   * request's rules must lie within it; without one, the caller holds the node token: the operator.
   */
  private async create(
    project: string,
    request: SandboxRequest,
    options: { signal?: AbortSignal; quota?: number | undefined; network?: NetworkGrant | undefined },
  ): Promise<BackendSandbox> {
    const { backend, resources, network } = sandboxRequestSchema.parse(request);
    const granted = { ...request, network: withinGrant(network, options.network, project) };
    const timer = this.metrics.createSeconds.startTimer({ backend });
    const [sandbox] = await this.admitted(
      { project, count: 1, memoryMib: resources.memoryMib, backend, quota: options.quota },
      async () => [
        await this.platform.createSandboxFor(project, granted, definedFields({ signal: options.signal })),
      ],
    );
    timer();
    return sandbox!;
  }

  /**
   * `count` copies of a project's sandbox that carry on from its processes and memory, on this
   * node: admitted against its capacity and memory as creates are, owned by the same project.
   */
  private async forkInMemory(
    project: string,
    id: string,
    count: number,
    options: { signal?: AbortSignal; checkpoint?: SandboxCheckpoint | string; quota?: number | undefined },
  ): Promise<BackendSandbox[]> {
    const source = this.projectSandbox(project, id);
    const { quota, ...forkOptions } = options;
    return this.admitted(
      { project, count, memoryMib: source.resources.memoryMib, backend: source.backend, quota },
      () => this.platform.forkInMemory(source.id, count, definedFields(forkOptions)),
    );
  }

  /**
   * Makes `count` sandboxes of `memoryMib` each for `project` if this node has room for them (and,
   * with etcd and a `quota` from the controller, if the project's quota across the cluster has),
   * and owns them. Their memory is charged before the slow part, so concurrent creates cannot all
   * pass the check.
   */
  private async admitted(
    demand: { project: string; count: number; memoryMib: number; backend: string; quota: number | undefined },
    make: () => Promise<BackendSandbox[]>,
  ): Promise<BackendSandbox[]> {
    const { project, count, memoryMib, backend } = demand;
    const refuse = (reason: Refusal, error: unknown): never => {
      this.metrics.admissions.inc({ result: 'refused', reason });
      this.metrics.creates.inc({ backend, outcome: 'refused' }, count);
      throw error;
    };
    if (this.closed || this.draining) {
      refuse(
        'draining',
        new SandgymError(
          'admission_rejected',
          `Node ${this.nodeId} is ${this.closed ? 'shutting down' : 'draining'}`,
          { retryable: true },
        ),
      );
    }
    this.prune();
    if (this.owned.size + this.pending + count > this.maxSandboxes) {
      refuse(
        'full',
        new SandgymError(
          'admission_rejected',
          // no figures: how many sandboxes the node runs counts every tenant's
          `Node ${this.nodeId} has no room for ${count > 1 ? `${count} more sandboxes` : 'another sandbox'} (it runs at most ${this.maxSandboxes})`,
          { retryable: true },
        ),
      );
    }
    try {
      this.memory.check(this.nodeId, memoryMib * count);
    } catch (error) {
      refuse('memory', error);
    }
    const pendingKey = `pending-${++this.creates}`;
    this.memory.admit(pendingKey, memoryMib * count);
    this.pending += count;
    try {
      const quota = this.cluster?.quota;
      const claims =
        quota && demand.quota !== undefined
          ? await quota.claim(project, count, demand.quota).catch((error: unknown) => refuse('quota', error))
          : [];
      this.metrics.admissions.inc({ result: 'admitted', reason: '' });
      let made: BackendSandbox[];
      try {
        made = await make();
      } catch (error) {
        this.metrics.creates.inc({ backend, outcome: 'failed' }, count);
        for (const claim of claims) await quota?.release(project, claim).catch(() => undefined);
        throw error;
      }
      this.metrics.creates.inc({ backend, outcome: 'created' }, made.length);
      for (const [index, sandbox] of made.entries()) {
        this.owned.set(sandbox.id, { sandbox, project });
        this.memory.admit(sandbox.id, memoryMib);
        const claim = claims[index];
        await (claim ? quota?.settle(project, claim, sandbox.id) : quota?.hold(project, sandbox.id))?.catch(
          (error: unknown) =>
            this.logger.warn({ sandbox: sandbox.id, err: error }, 'etcd did not record a sandbox'),
        );
      }
      for (const claim of claims.slice(made.length))
        await quota?.release(project, claim).catch(() => undefined);
      return made;
    } finally {
      this.memory.release(pendingKey);
      this.pending -= count;
    }
  }

  /** A sandbox of the caller's project; another project's is as missing as one that never was. */
  private sandboxOf(id: string, call: CallContext): BackendSandbox {
    return this.projectSandbox(call.principal.project, id);
  }

  private projectSandbox(project: string, id: string): BackendSandbox {
    const found = this.owned.get(id);
    if (found?.project !== project) {
      throw new SandgymError('not_found', `No sandbox ${id} on node ${this.nodeId}`);
    }
    return found.sandbox;
  }

  /**
   * A project's client of this node in this process: what the node serves that project over the
   * wire, for services that run on the node (served environments), within the `limits` the
   * call that asked for it came with. Closing it destroys the sandboxes it created.
   */
  clientFor(project: string, limits: ProjectLimits = {}): NodeProjectClient {
    return new NodeProjectClient(
      {
        platform: this.platform,
        create: (owner, request, options) => this.create(owner, request, { ...options, ...limits }),
        forkInMemory: (owner, id, count, options) =>
          this.forkInMemory(owner, id, count, { ...options, quota: limits.quota }),
        sandboxOf: (owner, id) => this.projectSandbox(owner, id),
        destroy: (owner, id) => this.destroy(id, owner),
      },
      project,
    );
  }

  private async stepLogOf(id: string, call: CallContext) {
    this.sandboxOf(id, call);
    return this.platform.stepLog(id);
  }

  private async *exec(request: ExecRequest, call: CallContext) {
    const { sandboxId, argv, options } = execArguments(request, call);
    const running = this.sandboxOf(sandboxId, call).execStream(argv, options);
    for await (const chunk of running.output)
      yield { type: 'chunk' as const, stream: chunk.stream, data: chunk.data };
    yield { type: 'result' as const, result: await running.result };
  }

  private async destroy(id: string, project: string): Promise<void> {
    const found = this.owned.get(id);
    // another project's sandbox is as missing as one that never was
    if (found?.project !== project)
      throw new SandgymError('not_found', `No sandbox ${id} on node ${this.nodeId}`);
    const released = this.forget(id);
    await found.sandbox.close();
    // the Destroy call returns once etcd counts the room it made
    await released;
  }

  /** Stops counting a sandbox that is gone (destroyed here, or by its run's cleanup). */
  private forget(id: string): Promise<void> {
    const found = this.owned.get(id);
    if (!found) return Promise.resolve();
    this.owned.delete(id);
    this.memory.release(id);
    return (this.cluster?.quota.release(found.project, id) ?? Promise.resolve()).catch((error: unknown) =>
      this.logger.warn({ sandbox: id, err: error }, 'etcd still counts a gone sandbox'),
    );
  }

  /** Stops serving and destroys every sandbox it runs. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.measuring);
    // leave first, so controllers stop placing here before the listener goes
    await this.cluster?.close();
    await this.server?.close();
    await this.metricsServer?.close();
    for (const served of this.served) await served.close().catch(() => undefined);
    this.owned.clear();
    await this.platform.close();
  }
}

/** What request bodies may hold on a node, per project and in all (see NodeAgentOptions). */
function nodeRequestBudget(options: NodeAgentOptions): RequestBudget {
  const perProject = options.maxInFlightBytes ?? DEFAULT_IN_FLIGHT_BYTES;
  return new RequestBudget({
    perProjectBytes: () => perProject,
    totalBytes: options.maxInFlightTotalBytes ?? 4 * perProject,
    raiseWith: "the node's --max-in-flight-mib",
  });
}

/** A wire exec request as backend arguments; the call's cancellation reaches the command. */
function execArguments(
  request: ExecRequest,
  call: CallContext,
): { sandboxId: string; argv: string[]; options: ExecOptions } {
  const { sandboxId, argv, ...rest } = request;
  return { sandboxId, argv, options: { ...definedFields(rest), signal: call.signal } };
}

/** The rules of `rules` the project's `grant` allows (see grantedRules); all of them without one. */
function withinGrant(rules: readonly string[], grant: NetworkGrant | undefined, project: string): string[] {
  return grant === undefined ? [...rules] : grantedRules(rules, grant, `project ${project}`);
}

/** The port of a listen address (`HOST:PORT` or `PORT`); 0 when there is none or it is picked at start. */
function portOf(listen: string | undefined): number {
  return Number(/(?:^|:)(\d{1,5})$/.exec(listen ?? '')?.[1] ?? 0);
}

/**
 * What the node adds to its platform's control plane (LocalPlatformOptions.controlPlane, where
 * the operator names the controllers): its own `ports` on every address, and its etcd.
 */
function controlPlaneOf(options: NodeAgentOptions, ports: number[]): string[] {
  return [
    ...ports.filter((port) => port > 0).map((port) => `:${port}`),
    ...(options.etcd ? [...options.etcd.endpoints, `:${ETCD_PEER_PORT}`] : []),
  ];
}

/** The host of a listen address controllers can dial: itself, or loopback for a wildcard. */
function advertisedHost(listen: string): string {
  const host = listen.replace(/:\d+$/, '');
  return host === '0.0.0.0' || host === '[::]' || host === '' ? '127.0.0.1' : host;
}

function info(sandbox: BackendSandbox): SandboxInfo {
  return {
    id: sandbox.id,
    backend: sandbox.backend,
    state: sandbox.state,
    failure: sandbox.failure ?? null,
    layers: sandbox.layers.map((layer) => ({ ...layer })),
    labels: { ...sandbox.labels },
    resources: { ...sandbox.resources },
  };
}
