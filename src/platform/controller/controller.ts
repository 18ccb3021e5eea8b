import {
  ID_KINDS,
  SandgymError,
  isSandgymError,
  nodeOfEnvId,
  nodeOfSandboxId,
  type Logger,
} from '../../common/index.ts';
import { checkNetworkGrant, grantedRules, type NetworkGrant } from '../../backends/index.ts';
import { FairQueue } from './fair-queue.ts';
import { NodeWatcher } from './node-watcher.ts';
import { runService } from './run-service.ts';
import { envRouting } from './env-routing.ts';
import { Placer, type Demand } from './placement.ts';
import { sandboxRequestSchema } from '../sandbox-request.ts';
import {
  NETWORK_GRANT_KEY,
  DEFAULT_IN_FLIGHT_BYTES,
  PROJECT_KEY,
  QUOTA_KEY,
  RequestBudget,
  SANDBOXES,
  STORE_QUOTA_KEY,
  WireServer,
  register,
  tokenAuthenticator,
  type Authenticate,
  type CallContext,
  type IdResolvers,
  type SandboxInfo,
  type TlsFiles,
  type WireClient,
} from '../wire/index.ts';
import { connectEtcd, type EtcdClient, type EtcdOptions } from '../etcd/etcd-connection.ts';
import { watchMembership } from '../etcd/node-membership.ts';
import { RunLedger } from '../etcd/shared-runs.ts';
import { ControllerMetrics } from '../metrics/controller-metrics.ts';
import { serveMetrics, type MetricsServer } from '../metrics/metrics-server.ts';

/** A project a token maps to, its quota, and the network rules it may use. */
export interface ProjectGrant {
  project: string;
  /** Most sandboxes the project may have at once across the cluster. */
  maxSandboxes: number;
  /**
   * The network rules its sandboxes may name (see NetworkGrant): rule-book names, and `host:` or
   * `cidr:` sets inside which it may name any host, sub-range or port. @default none: loopback only
   */
  network?: string[];
  /**
   * Most bytes of request bodies the project's calls may hold at once on each controller replica;
   * more is refused unread, retryable. @default 256 MiB
   */
  maxInFlightBytes?: number | undefined;
  /**
   * Most bytes the project may hold in the shared layer store (the layers and environments it
   * packs); passed to the node that packs. @default the node's (sandgym node --max-store-mib)
   */
  maxStoreBytes?: number | undefined;
}

/** Options for {@link Controller.start}. */
export interface ControllerOptions {
  listen: string;
  /** Node agent addresses, host:port: a fixed cluster, for one controller without etcd. */
  nodes?: string[];
  /**
   * Follow membership in etcd instead: nodes come and go with their leases, and quotas are
   * enforced there, exactly, however many replicas admit.
   */
  etcd?: EtcdOptions;
  /** Serve clients over mutual TLS, and call nodes over it with the same pair. */
  tls?: TlsFiles;
  /** Where to serve Prometheus metrics, at /metrics (see serveMetrics): `PORT` is loopback's. */
  metricsListen?: string;
  /** The bearer token a scrape must present; required to serve metrics beyond loopback. */
  metricsToken?: string;
  /** The token node agents accept. */
  nodeToken: string;
  /** Client tokens and what each may do. */
  grants: Record<string, ProjectGrant>;
  logger: Logger;
  /** How often node loads are polled. Default 500 ms. */
  pollMs?: number;
  /** How many random nodes placement compares. Default 2. */
  sampleK?: number;
  /** How long a create may wait for room before it fails. Default 60 s. */
  queueTimeoutMs?: number;
}

type SandboxClient = WireClient<typeof SANDBOXES>;

/**
 * A controller owns nothing an id names: every call it takes reaches a node with the caller's
 * project in `sandgym-project` (see `as` in {@link Controller.service} and runService), and that
 * node's resolvers look each id up for the project before its handlers run.
 */
const RESOLVED_BY_NODES: IdResolvers = Object.fromEntries(ID_KINDS.map((kind) => [kind, () => undefined]));

/**
 * A controller replica. It keeps no state of its own: it authenticates clients, places creates
 * on nodes (power-of-k over the loads its watcher polls, plus its own in-flight placements),
 * queues bursts the cluster cannot hold yet, and routes every sandbox call to the node its id
 * names. Run several behind one address; a restarted one rebuilds its view from the nodes.
 */
export class Controller {
  private readonly placer: Placer;
  private readonly queue = new FairQueue();
  /** Per project, creates this replica placed that the nodes have not reported yet. */
  private readonly inFlight = new Map<string, number>();
  /** Per node, placements to forget once a poll that started after them completes. */
  private readonly settled = new Map<string, { at: number; release: () => void }[]>();
  readonly metrics: ControllerMetrics;
  private metricsServer: MetricsServer | undefined;
  private etcd: { client: EtcdClient; membership: { close(): Promise<void> }; runs: RunLedger } | undefined;
  /** The grants in force: those it started with, until {@link replaceGrants}. */
  private grants: Record<string, ProjectGrant>;
  private authenticate: Authenticate;

  private constructor(
    private readonly options: ControllerOptions,
    private readonly watcher: NodeWatcher,
    private server: WireServer | undefined,
  ) {
    this.placer = new Placer(options.sampleK ?? 2);
    this.grants = options.grants;
    this.authenticate = tokenAuthenticator(projectsOf(options.grants));
    this.metrics = new ControllerMetrics({
      queueDepths: () => this.queue.depths(),
      nodes: () => {
        const loads = this.watcher.loads();
        return {
          healthy: loads.filter((n) => n.healthy).length,
          draining: loads.filter((n) => n.draining).length,
          unhealthy: loads.filter((n) => !n.healthy && !n.draining).length,
        };
      },
    });
  }

  static async start(options: ControllerOptions): Promise<Controller> {
    const logger = options.logger.child({ component: 'controller' });
    const nodes = options.nodes ?? [];
    if (nodes.length > 0 === Boolean(options.etcd)) {
      throw new SandgymError(
        'invalid_argument',
        'Give a controller either its nodes (--nodes HOST:PORT,...) or etcd to find them in (--etcd URL,...), not both or neither',
      );
    }
    checkGrants(options.grants);
    const watcher = new NodeWatcher(
      nodes,
      { token: options.nodeToken, tls: options.tls },
      options.pollMs ?? 500,
      logger,
    );
    const controller = new Controller(options, watcher, undefined);
    watcher.onPolled((nodeId, polledAt) => controller.polled(nodeId, polledAt));
    try {
      if (options.etcd) {
        const client = await connectEtcd(options.etcd);
        controller.etcd = {
          client,
          membership: { close: () => Promise.resolve() },
          runs: new RunLedger(client),
        };
        controller.etcd.membership = await watchMembership(
          client,
          {
            joined: (record) => watcher.join(record.nodeId, record.address),
            left: (nodeId) => {
              watcher.leave(nodeId);
              controller.queue.wake();
            },
          },
          logger,
        );
      }
      await watcher.start();
      if (options.metricsListen)
        controller.metricsServer = await serveMetrics(
          options.metricsListen,
          controller.metrics.registry,
          logger,
          options.metricsToken,
        );
    } catch (error) {
      await controller.close();
      throw error;
    }
    controller.server = await WireServer.listen(
      options.listen,
      [
        controller.service(),
        runService(controller.watcher, controller.etcd?.runs),
        // a Make is placed as a create, and counts against the quota as one (see NodeStatus.projects)
        envRouting(controller.watcher, (request, call) =>
          controller.place(
            request.spec.kind === 'sandbox' ? (request.spec.sandbox ?? {}) : {},
            call,
            (nodeId, metadata) =>
              controller.watcher
                .envClientOf(nodeId, 'node')
                .call('Make', request, { signal: call.signal, metadata }),
            request.beside === undefined ? undefined : nodeOfEnvId(request.beside),
          ),
        ),
      ],
      {
        // the grants in force at each call, so a reload takes effect at once
        authenticate: (metadata, path) => controller.authenticate(metadata, path),
        resolvers: RESOLVED_BY_NODES,
        // only granted projects get in, so the grants bound the sum of these
        budget: new RequestBudget({
          perProjectBytes: (project) =>
            controller.grantOf(project)?.maxInFlightBytes ?? DEFAULT_IN_FLIGHT_BYTES,
          raiseWith: "the project's maxInFlightBytes in the controller's grants file",
        }),
        logger,
        ...(options.tls ? { tls: options.tls } : {}),
      },
    ).catch(async (error: unknown) => {
      // a controller that cannot listen stops its node polls too, so its process can end
      await controller.close();
      throw error;
    });
    logger.info(
      {
        port: controller.server.port,
        nodes: options.etcd ? 'etcd' : nodes.length,
        tls: Boolean(options.tls),
      },
      'controller listening',
    );
    return controller;
  }

  /** The port /metrics is served on (with `metricsListen`). */
  get metricsPort(): number {
    if (!this.metricsServer)
      throw new SandgymError(
        'failed_precondition',
        'The controller serves no metrics: give it metricsListen',
      );
    return this.metricsServer.port;
  }

  get port(): number {
    if (!this.server) throw new SandgymError('failed_precondition', 'The controller is not listening');
    return this.server.port;
  }

  private polled(nodeId: string, polledAt: number): void {
    const pending = this.settled.get(nodeId) ?? [];
    const still = pending.filter((entry) => {
      if (entry.at >= polledAt) return true;
      entry.release();
      return false;
    });
    if (still.length) this.settled.set(nodeId, still);
    else this.settled.delete(nodeId);
    // every fresh view may have room (a destroy elsewhere, a node back): give waiting creates a
    // turn. A destroy through this replica wakes one at once, but its node may not show the room
    // until this poll, so the poll must wake them again.
    this.queue.wake();
  }

  private service() {
    const route = (sandboxId: string): SandboxClient =>
      this.watcher.clientOf(nodeOfSandboxId(sandboxId), `sandbox ${sandboxId}`);
    const as = (call: CallContext) => ({
      signal: call.signal,
      metadata: { [PROJECT_KEY]: call.principal.project },
    });
    return register(SANDBOXES, {
      Create: ({ request }, call) => this.create(request, call),
      Describe: (request, call) => route(request.sandboxId).call('Describe', request, as(call)),
      Exec: (request, call) => route(request.sandboxId).stream('Exec', request, as(call)),
      ExecCollected: (request, call) => route(request.sandboxId).call('ExecCollected', request, as(call)),
      ReadFile: (request, call) => route(request.sandboxId).call('ReadFile', request, as(call)),
      WriteFile: (request, call) => route(request.sandboxId).call('WriteFile', request, as(call)),
      ListDir: (request, call) => route(request.sandboxId).call('ListDir', request, as(call)),
      Pause: (request, call) => route(request.sandboxId).call('Pause', request, as(call)),
      Resume: (request, call) => route(request.sandboxId).call('Resume', request, as(call)),
      Hibernate: (request, call) => route(request.sandboxId).call('Hibernate', request, as(call)),
      Checkpoint: (request, call) => route(request.sandboxId).call('Checkpoint', request, as(call)),
      RestoreCheckpoint: (request, call) =>
        route(request.sandboxId).call('RestoreCheckpoint', request, as(call)),
      ForkInMemory: (request, call) => {
        // the copies land on the source's node, outside placement, but within the project's quota
        this.checkQuota(call.principal.project, request.count);
        return route(request.sandboxId).call('ForkInMemory', request, {
          ...as(call),
          metadata: this.nodeMetadata(call.principal.project),
        });
      },
      Stats: (request, call) => route(request.sandboxId).call('Stats', request, as(call)),
      WrittenPaths: (request, call) => route(request.sandboxId).call('WrittenPaths', request, as(call)),
      SetNetwork: (request, call) => {
        const { project } = call.principal;
        grantedRules(request.rules, this.networkOf(project), `project ${project}`);
        return route(request.sandboxId).call('SetNetwork', request, {
          ...as(call),
          metadata: this.nodeMetadata(project),
        });
      },
      Destroy: async (request, call) => {
        const done = await route(request.sandboxId).call('Destroy', request, as(call));
        this.queue.wake(1);
        return done;
      },
      PackDiff: (request, call) => {
        // the node that packs holds the project to its store quota
        const quota = this.grantOf(call.principal.project)?.maxStoreBytes;
        const forward = as(call);
        return route(request.sandboxId).call(
          'PackDiff',
          request,
          quota === undefined
            ? forward
            : { ...forward, metadata: { ...forward.metadata, [STORE_QUOTA_KEY]: String(quota) } },
        );
      },
      Step: (request, call) => route(request.sandboxId).call('Step', request, as(call)),
      Trajectory: (request, call) => route(request.sandboxId).call('Trajectory', request, as(call)),
      List: async (_request, call) => ({
        sandboxes: (await this.fanOut((node) => node.call('List', {}, as(call)))).flatMap((r) => r.sandboxes),
      }),
      // the store is shared by every node, so any one of them can answer
      ListEnvironments: (_request, call) => this.anyNode().call('ListEnvironments', {}, as(call)),
      GetEnvironment: (request, call) => this.anyNode().call('GetEnvironment', request, as(call)),
      Gc: async (_request, call) => {
        const reports = await this.fanOut((node) => node.call('Gc', {}, as(call)));
        return {
          sandboxes: reports.flatMap((r) => r.sandboxes),
          mounts: reports.flatMap((r) => r.mounts),
          cgroups: reports.flatMap((r) => r.cgroups),
        };
      },
      LayerGc: async (request, call) => {
        const reports = await this.fanOut((node) => node.call('LayerGc', request, as(call)));
        return {
          unmounted: reports.flatMap((r) => r.unmounted),
          removedCopies: reports.flatMap((r) => r.removedCopies),
          removedLayers: reports.flatMap((r) => r.removedLayers),
          freedBytes: reports.reduce((sum, r) => sum + r.freedBytes, 0),
        };
      },
    });
  }

  private async fanOut<T>(work: (node: SandboxClient) => Promise<T>): Promise<T[]> {
    return Promise.all(this.watcher.reachableClients().map(work));
  }

  private anyNode(): SandboxClient {
    const [first] = this.watcher.reachableClients();
    if (!first) throw new SandgymError('node_lost', 'No node agent is reachable', { retryable: true });
    return first;
  }

  /**
   * Puts new grants in force (a reloaded grants file): calls from now on are authenticated,
   * held to quotas and network rules by them. Sandboxes keep running whatever the new grants
   * say; a project over its new quota makes no more until it is under. Grants that do not hold
   * together are refused and the old ones stay.
   */
  replaceGrants(grants: Record<string, ProjectGrant>): void {
    checkGrants(grants);
    const authenticate = tokenAuthenticator(projectsOf(grants));
    this.grants = grants;
    this.authenticate = authenticate;
  }

  private grantOf(project: string): ProjectGrant | undefined {
    return Object.values(this.grants).find((g) => g.project === project);
  }

  /** The network rules a project's grant lets its sandboxes name. */
  private networkOf(project: string): NetworkGrant {
    return this.grantOf(project)?.network ?? [];
  }

  /**
   * What a node is told with a call that makes sandboxes or sets their rules: the project, its
   * network grant, which the node enforces again, and with etcd its quota, which the node
   * enforces in a transaction (the only place that sees every replica's creates).
   */
  private nodeMetadata(project: string): Record<string, string> {
    const grant = this.grantOf(project);
    return {
      [PROJECT_KEY]: project,
      [NETWORK_GRANT_KEY]: JSON.stringify(this.networkOf(project)),
      ...(this.options.etcd && grant ? { [QUOTA_KEY]: String(grant.maxSandboxes) } : {}),
    };
  }

  /**
   * Refuses `adding` more sandboxes for a project its quota has no room for, by what this replica
   * sees. Without etcd this is the quota; with it, the nodes enforce it exactly, so this replica
   * stays out of the way.
   */
  private checkQuota(project: string, adding: number): void {
    if (this.options.etcd) return;
    const grant = this.grantOf(project);
    const live = this.watcher.projectCount(project) + (this.inFlight.get(project) ?? 0);
    if (grant && live + adding > grant.maxSandboxes) {
      throw new SandgymError(
        'resource_exhausted',
        `Project ${project} has ${live} of its ${grant.maxSandboxes} sandboxes${adding > 1 ? ` and asks for ${adding} more` : ''}; destroy some or raise its quota`,
        { retryable: true },
      );
    }
  }

  private async create(request: unknown, call: CallContext): Promise<SandboxInfo> {
    const { project } = call.principal;
    const timer = this.metrics.createSeconds.startTimer();
    try {
      const info = await this.place(request, call, (nodeId, metadata) =>
        this.watcher.clientOf(nodeId, 'node').call('Create', { request }, { signal: call.signal, metadata }),
      );
      timer({ outcome: 'created' });
      this.metrics.creates.inc({ project, outcome: 'created' });
      return info;
    } catch (error) {
      const reason = refusalOf(error);
      timer({ outcome: reason ? 'refused' : 'failed' });
      this.metrics.creates.inc({ project, outcome: reason ? 'refused' : 'failed' });
      if (reason) this.metrics.admissions.inc({ project, result: 'refused', reason });
      throw error;
    }
  }

  /**
   * The quota check, placement, the node's veto, and waiting for room, in that order, for what
   * `send` asks the chosen node to make (a sandbox of `request`, or an env whose episodes run in
   * one) with the project's metadata.
   */
  private async place<T>(
    request: unknown,
    call: CallContext,
    send: (nodeId: string, metadata: Record<string, string>) => Promise<T>,
    onlyNode?: string,
  ): Promise<T> {
    // an env made beside another goes to that env's node or nowhere (its checkpoints are there)
    const loads = () =>
      onlyNode === undefined
        ? this.watcher.loads()
        : this.watcher.loads().filter((load) => load.nodeId === onlyNode);
    const { project } = call.principal;
    const resolved = sandboxRequestSchema.parse(request);
    grantedRules(resolved.network, this.networkOf(project), `project ${project}`);
    this.checkQuota(project, 1);
    const demand: Demand = { backend: resolved.backend, memoryMib: resolved.resources.memoryMib };
    const deadline = Date.now() + (this.options.queueTimeoutMs ?? 60_000);
    const vetoed = new Set<string>();
    let waited = false;
    for (;;) {
      if (call.signal.aborted) throw new SandgymError('cancelled', 'The create was cancelled');
      const node = this.placer.choose(loads(), demand, vetoed);
      if (!node) {
        if (onlyNode !== undefined && loads().length === 0)
          throw new SandgymError(
            'node_lost',
            `Node ${onlyNode}, where the env to make this one beside is, is not serving`,
          );
        const able = loads().filter(
          (n) => n.backends.includes(demand.backend) && n.memoryCapacityMib >= demand.memoryMib,
        );
        if (able.length === 0) {
          throw new SandgymError(
            'admission_rejected',
            `No node can ever hold a ${demand.backend} sandbox of ${demand.memoryMib} MiB; ask for less memory or another backend`,
          );
        }
        // a drain ends when its operator says, not when sandboxes end: waiting would be silent
        if (able.every((n) => n.draining)) {
          throw new SandgymError(
            'admission_rejected',
            `Every node that can hold a ${demand.backend} sandbox is draining (${able.map((n) => n.nodeId).join(', ')}): try again once one is undrained (sandgym node undrain --node HOST:PORT) or a node joins`,
            { retryable: true },
          );
        }
        this.options.logger.debug(
          {
            project,
            loads: loads().map((n) => [n.nodeId, n.healthy, n.sandboxes, this.placer.load(n)]),
          },
          'create waits for room',
        );
        await this.queue.wait(project, deadline, call.signal, waited);
        waited = true;
        vetoed.clear();
        continue;
      }
      const release = this.reserve(node.nodeId, project, demand);
      try {
        const made = await send(node.nodeId, this.nodeMetadata(project));
        this.settleAfterNextPoll(node.nodeId, release);
        this.metrics.admissions.inc({ project, result: 'admitted', reason: '' });
        return made;
      } catch (error) {
        release();
        // a full or lost node: place elsewhere; anything else is the caller's to see
        if (
          isSandgymError(error, 'admission_rejected', 'node_lost') &&
          (error.retryable || error.code === 'node_lost')
        ) {
          vetoed.add(node.nodeId);
          continue;
        }
        throw error;
      }
    }
  }

  private reserve(nodeId: string, project: string, demand: Demand): () => void {
    const releasePlacement = this.placer.reserve(nodeId, demand);
    this.inFlight.set(project, (this.inFlight.get(project) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      releasePlacement();
      const left = (this.inFlight.get(project) ?? 1) - 1;
      if (left > 0) this.inFlight.set(project, left);
      else this.inFlight.delete(project);
    };
  }

  private settleAfterNextPoll(nodeId: string, release: () => void): void {
    const pending = this.settled.get(nodeId) ?? [];
    pending.push({ at: Date.now(), release });
    this.settled.set(nodeId, pending);
  }

  async close(): Promise<void> {
    await this.server?.close();
    await this.metricsServer?.close();
    await this.etcd?.membership.close();
    this.etcd?.client.close();
    this.watcher.close();
  }
}

/**
 * Checks each grant's network rules, and that the tokens of one project grant it the same ones
 * (a call knows its project, not which of its tokens it came with).
 */
function checkGrants(grants: Record<string, ProjectGrant>): void {
  const networks = new Map<string, string>();
  for (const grant of Object.values(grants)) {
    const network = grant.network ?? [];
    checkNetworkGrant(network, `the grant of project ${grant.project}`);
    const key = JSON.stringify([...network].sort());
    if ((networks.get(grant.project) ?? key) !== key) {
      throw new SandgymError(
        'invalid_argument',
        `Tokens of project ${grant.project} grant it different network rules: give each the same`,
      );
    }
    networks.set(grant.project, key);
  }
}

/** Each token's project, as the authenticator takes them. */
function projectsOf(grants: Record<string, ProjectGrant>): Record<string, string> {
  return Object.fromEntries(Object.entries(grants).map(([token, grant]) => [token, grant.project]));
}

/** Why a create was refused, as the metrics label it; undefined for failures that are not refusals. */
function refusalOf(error: unknown): string | undefined {
  if (isSandgymError(error, 'resource_exhausted'))
    return /quota/.test(error.message) ? 'quota' : 'queue_timeout';
  if (isSandgymError(error, 'admission_rejected'))
    return /draining/.test(error.message) ? 'draining' : 'never_fits';
  return undefined;
}
