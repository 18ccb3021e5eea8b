/**
 * A node simulator for benchmarking the control plane only. It is NOT a backend: no user can
 * select it, it runs no process, container or VM, and nothing outside benchmarks/ and its tests
 * imports it. Each simulated node registers in etcd as a node agent does (NodeMembership, on a
 * lease it keeps alive) and serves the node's real wire (the Sandboxes and Node services) with
 * the same authentication and id checks. Create, Destroy, Describe and Status work;
 * sandboxes are records, made after a configurable latency; and a create claims the project's
 * quota in etcd with the same ProjectQuotaLedger a node agent uses. Every other call is refused.
 */
import { SandgymError, newSandboxId, type Logger } from '../src/common/index.ts';
import {
  NODE,
  NodeMembership,
  ProjectQuotaLedger,
  SANDBOXES,
  WireServer,
  quotaOf,
  register,
  sandboxRequestSchema,
  tokenAuthenticator,
  type EtcdClient,
  type Handlers,
  type IdResolvers,
  type NodeStatus,
  type SandboxInfo,
} from '../src/platform/index.ts';

/** How the simulated nodes of one process behave. */
export interface SimulatorOptions {
  /** The token controllers present (as SANDGYM_NODE_TOKEN for a real node). */
  token: string;
  /** Most sandboxes (records) each simulated node holds. */
  capacity: number;
  /** How long a create takes on the node after admission, as a container's start would. */
  createLatencyMs: number;
  /**
   * Ignore the quota controllers pass: each sandbox's key under `held/` is written, and nothing
   * else (no claim, block or guard key), so "quotas off" costs one etcd write per create.
   */
  quotasOff: boolean;
  /** Seconds of the nodes' etcd leases. */
  leaseTtlSeconds: number;
  logger: Logger;
}

interface SandboxRecord {
  project: string;
  info: SandboxInfo;
}

/** What the memory figure of a simulated node says: enough that placement never runs short. */
const MEMORY_CAPACITY_MIB = 1024 * 1024 * 1024;

/** Where a live sandbox's key is, as ProjectQuotaLedger keeps it. */
const heldKey = (project: string, id: string): string => `/sandgym/quota/${project}/held/${id}`;

/** The disk a record says its sandbox has when the request names none. */
const SIMULATED_DISK_MIB = 10 * 1024;

/** What a preloaded record says of itself. */
const PRELOADED: SandboxInfo = {
  id: '',
  backend: 'container',
  state: 'running',
  failure: null,
  layers: [],
  labels: {},
  resources: { cpu: 1, memoryMib: 512, pids: 512, outputCapBytes: 1024 * 1024, diskMib: SIMULATED_DISK_MIB },
};

/** One simulated node: its records, its membership in etcd, its ledger and its wire server. */
export class SimulatedNode {
  /** Creates this node made, the milliseconds they took on it, and of those the held key's write. */
  readonly timing = { creates: 0, createMs: 0, settleMs: 0 };
  private readonly records = new Map<string, SandboxRecord>();
  /** Live records per project, kept as records come and go, so Status costs nothing per record. */
  private readonly perProject = new Map<string, number>();
  private pending = 0;
  private closed = false;

  private constructor(
    readonly nodeId: string,
    private readonly options: SimulatorOptions,
    private readonly membership: NodeMembership,
    readonly quota: ProjectQuotaLedger,
    private server: WireServer | undefined,
  ) {}

  /** Listens on a loopback port, then registers in etcd with that address. */
  static async start(etcd: EtcdClient, nodeId: string, options: SimulatorOptions): Promise<SimulatedNode> {
    let node: SimulatedNode | undefined;
    const server = await WireServer.listen(
      '127.0.0.1:0',
      [
        register(
          SANDBOXES,
          sandboxHandlers(() => node!),
        ),
        register(NODE, {
          Status: () => Promise.resolve(node!.status()),
          Drain: refusedStream('Drain'),
          Undrain: () => Promise.reject(refused('Undrain')),
        }),
      ],
      {
        authenticate: tokenAuthenticator({ [options.token]: 'default' }, { trustProjectHeader: true }),
        resolvers: simulatorResolvers(() => node!),
        logger: options.logger,
      },
    );
    try {
      const membership = await NodeMembership.join(
        etcd,
        {
          nodeId,
          address: `127.0.0.1:${server.port}`,
          backends: ['container'],
          capacity: options.capacity,
          memoryCapacityMib: MEMORY_CAPACITY_MIB,
          draining: false,
        },
        options.leaseTtlSeconds,
        options.logger,
      );
      node = new SimulatedNode(
        nodeId,
        options,
        membership,
        new ProjectQuotaLedger(etcd, membership, nodeId),
        server,
      );
      return node;
    } catch (error) {
      await server.close();
      throw error;
    }
  }

  get port(): number {
    return this.server!.port;
  }

  /** Live records, all projects. */
  get live(): number {
    return this.records.size;
  }

  status(): NodeStatus {
    return {
      nodeId: this.nodeId,
      backends: ['container'],
      healthy: !this.closed,
      draining: false,
      sandboxes: this.records.size,
      capacity: this.options.capacity,
      memoryCommittedMib: 0,
      memoryCapacityMib: MEMORY_CAPACITY_MIB,
      projects: Object.fromEntries(this.perProject),
    };
  }

  /** A project's record, or `not_found` as for an id never made (another project's included). */
  recordOf(project: string, id: string): SandboxRecord {
    const found = this.records.get(id);
    if (found?.project !== project)
      throw new SandgymError('not_found', `No sandbox ${id} on node ${this.nodeId}`);
    return found;
  }

  /**
   * Admission as a node agent makes it: room on the node, then (with a quota from the controller)
   * the project's claim in etcd, then the slow part, then the claim settled into the sandbox.
   */
  async create(project: string, request: unknown, quota: number | undefined): Promise<SandboxInfo> {
    if (this.closed)
      throw new SandgymError('admission_rejected', `Node ${this.nodeId} is shutting down`, {
        retryable: true,
      });
    if (this.records.size + this.pending >= this.options.capacity) {
      throw new SandgymError('admission_rejected', `Node ${this.nodeId} has no room for another sandbox`, {
        retryable: true,
      });
    }
    const resolved = sandboxRequestSchema.parse(request);
    this.pending++;
    const begun = performance.now();
    try {
      const claims =
        quota === undefined || this.options.quotasOff ? [] : await this.quota.claim(project, 1, quota);
      if (this.options.createLatencyMs > 0)
        await new Promise((resolve) => setTimeout(resolve, this.options.createLatencyMs));
      const id = newSandboxId(this.nodeId);
      const info: SandboxInfo = {
        id,
        backend: resolved.backend,
        state: 'running',
        failure: null,
        layers: [],
        labels: resolved.labels,
        resources: { ...resolved.resources, diskMib: resolved.resources.diskMib ?? SIMULATED_DISK_MIB },
      };
      this.add(id, { project, info });
      const [claim] = claims;
      const settling = performance.now();
      if (claim) await this.quota.settle(project, claim, id);
      else if (this.options.quotasOff) await this.membership.hold(heldKey(project, id), id);
      else await this.quota.hold(project, id);
      this.timing.creates++;
      this.timing.settleMs += performance.now() - settling;
      this.timing.createMs += performance.now() - begun;
      return info;
    } finally {
      this.pending--;
    }
  }

  /**
   * Makes `count` records of `project` at once, outside the wire and without claims, each held in
   * etcd as an adopted sandbox is: how a benchmark fills the cluster to a size before timing.
   */
  async preload(project: string, count: number): Promise<void> {
    const ids = Array.from({ length: count }, () => newSandboxId(this.nodeId));
    for (const id of ids) this.add(id, { project, info: { ...PRELOADED, id } });
    await this.quota.hold(project, ...ids);
  }

  private add(id: string, record: SandboxRecord): void {
    this.records.set(id, record);
    this.perProject.set(record.project, (this.perProject.get(record.project) ?? 0) + 1);
  }

  async destroy(project: string, id: string): Promise<void> {
    this.recordOf(project, id);
    this.records.delete(id);
    const left = (this.perProject.get(project) ?? 1) - 1;
    if (left > 0) this.perProject.set(project, left);
    else this.perProject.delete(project);
    // the Destroy call returns once etcd counts the room it made, as a node's does
    await this.quota.release(project, id);
  }

  /** Leaves etcd (its keys go with the lease) and stops serving. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.membership.leave();
    await this.server?.close();
    this.server = undefined;
  }
}

function refused(method: string): SandgymError {
  return new SandgymError(
    'failed_precondition',
    `${method}: the node simulator serves Create, Destroy, Describe and Status only`,
  );
}

/** A streaming method the simulator refuses before its first message. */
function refusedStream(method: string): () => AsyncIterable<never> {
  return () => ({
    [Symbol.asyncIterator]: () => ({ next: () => Promise.reject(refused(method)) }),
  });
}

/** Sandbox ids are looked up for the caller's project; every other kind is the simulator's to refuse. */
function simulatorResolvers(node: () => SimulatedNode): IdResolvers {
  return {
    sandbox: (id, { project }) => node().recordOf(project, id),
    checkpoint: () => undefined,
    layer: () => undefined,
    environment: () => undefined,
    env: () => undefined,
    envCheckpoint: () => undefined,
    run: () => undefined,
    episode: () => undefined,
  };
}

function sandboxHandlers(node: () => SimulatedNode): Handlers<typeof SANDBOXES> {
  const no = (method: string) => () => Promise.reject(refused(method));
  return {
    Create: ({ request }, call) => node().create(call.principal.project, request, quotaOf(call.metadata)),
    Describe: ({ sandboxId }, call) =>
      Promise.resolve(node().recordOf(call.principal.project, sandboxId).info),
    Destroy: async ({ sandboxId }, call) => {
      await node().destroy(call.principal.project, sandboxId);
      return {};
    },
    Exec: refusedStream('Exec'),
    ExecCollected: no('ExecCollected'),
    ReadFile: no('ReadFile'),
    WriteFile: no('WriteFile'),
    ListDir: no('ListDir'),
    Pause: no('Pause'),
    Resume: no('Resume'),
    Hibernate: no('Hibernate'),
    Checkpoint: no('Checkpoint'),
    RestoreCheckpoint: no('RestoreCheckpoint'),
    ForkInMemory: no('ForkInMemory'),
    Stats: no('Stats'),
    WrittenPaths: no('WrittenPaths'),
    SetNetwork: no('SetNetwork'),
    List: no('List'),
    PackDiff: no('PackDiff'),
    ListEnvironments: no('ListEnvironments'),
    GetEnvironment: no('GetEnvironment'),
    Step: no('Step'),
    Trajectory: no('Trajectory'),
    Gc: no('Gc'),
    LayerGc: no('LayerGc'),
  };
}
