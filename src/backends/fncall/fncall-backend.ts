import { SandgymError, newSandboxId, silentLogger, type Logger } from '../../common/index.ts';
import type {
  Backend,
  BackendCapabilities,
  BackendSandbox,
  GcReport,
  SandboxRecord,
  SandboxSpec,
} from '../contract.ts';
import type { ContainerBackend } from '../container/container-backend.ts';
import { FnCallSandbox } from './fncall-sandbox.ts';
import { WorkerSet } from './worker-set.ts';
import { reclaimExpiredOf } from '../internal/lifetime.ts';

/** Options for {@link FnCallBackend}. */
export interface FnCallBackendOptions {
  logger?: Logger;
  /** Most warm workers per environment (calls beyond wait for one). Default 4. */
  workersPerEnvironment?: number;
  /** A worker set nobody used for this long is destroyed. Default 60 s. */
  idleWorkerTtlMs?: number;
  /** The node id the workers' ids carry. */
  nodeId: string;
}

const CAPABILITIES: BackendCapabilities = {
  pause: false,
  hibernate: false,
  checkpoint: 'none',
  fork: false,
  shellSessions: false,
  ownNetwork: true,
  networkPolicy: false,
  statefulExec: false,
};

/** Marks the containers that serve FnCall sandboxes. */
const FNCALL_WORKER_LABEL = 'sandgym.fncall-worker';

/**
 * FnCall: short stateless calls (compile, run with stdin, judge) served by warm container workers
 * per environment, cleaned between calls, instead of a container per call. A FnCall sandbox is a
 * handle: its calls share the environment's workers with every other handle of that environment.
 */
export class FnCallBackend implements Backend {
  readonly name = 'fncall' as const;
  readonly capabilities = CAPABILITIES;
  private readonly sandboxes = new Map<string, FnCallSandbox>();
  private readonly sets = new Map<string, WorkerSet>();
  private readonly logger: Logger;
  private readonly reaper: NodeJS.Timeout;
  private isClosed = false;

  constructor(
    private readonly containers: ContainerBackend,
    private readonly options: FnCallBackendOptions,
  ) {
    this.logger = (options.logger ?? silentLogger()).child({ component: 'fncall-backend' });
    const ttlMs = options.idleWorkerTtlMs ?? 60_000;
    this.reaper = setInterval(() => void this.reapIdleSets(ttlMs), Math.min(ttlMs, 10_000));
    this.reaper.unref();
  }

  /** One worker set per layer stack, limits and CPU class: calls of different tenants share it. */
  private workersFor(spec: SandboxSpec): WorkerSet {
    const key = JSON.stringify([spec.layers.map((l) => l.digest), spec.resources, spec.qos]);
    let set = this.sets.get(key);
    if (!set) {
      set = new WorkerSet(
        this.containers,
        () => ({
          ...spec,
          id: newSandboxId(this.options.nodeId),
          env: {},
          labels: { [FNCALL_WORKER_LABEL]: 'true' },
        }),
        this.options.workersPerEnvironment ?? 4,
        this.logger,
      );
      this.sets.set(key, set);
    }
    return set;
  }

  private async reapIdleSets(ttlMs: number): Promise<void> {
    for (const [key, set] of this.sets) {
      if (!set.idleFor(ttlMs)) continue;
      this.sets.delete(key);
      await set.close();
    }
  }

  create(spec: SandboxSpec): Promise<FnCallSandbox> {
    if (this.isClosed)
      return Promise.reject(new SandgymError('failed_precondition', 'The FnCall backend is closed'));
    if (spec.layers.length === 0) {
      return Promise.reject(new SandgymError('invalid_argument', 'A FnCall sandbox needs an environment'));
    }
    const sandbox = new FnCallSandbox(
      spec,
      () => this.workersFor(spec),
      (closed) => this.sandboxes.delete(closed.id),
    );
    this.sandboxes.set(spec.id, sandbox);
    return Promise.resolve(sandbox);
  }

  list(): Promise<SandboxRecord[]> {
    return Promise.resolve(
      [...this.sandboxes.values()].map((sandbox) => ({
        id: sandbox.id,
        backend: 'fncall' as const,
        state: 'running' as const,
        ownerPid: process.pid,
        createdAt: new Date(sandbox.createdAt).toISOString(),
        labels: { ...sandbox.labels },
        layers: sandbox.layers.map((l) => l.digest),
      })),
    );
  }

  live(): FnCallSandbox[] {
    return [...this.sandboxes.values()];
  }

  /** A FnCall sandbox is a handle of the process that made it: no other process holds one. */
  holds(id: string): Promise<boolean> {
    return Promise.resolve(this.sandboxes.has(id));
  }

  /** A FnCall sandbox is only a handle: it dies with its process, and there is nothing to adopt. */
  adopt(): Promise<FnCallSandbox[]> {
    return Promise.resolve([]);
  }

  reclaimExpired(now = Date.now()): Promise<string[]> {
    return reclaimExpiredOf(this.live(), now, this.logger);
  }

  attach(id: string): BackendSandbox {
    const sandbox = this.sandboxes.get(id);
    if (!sandbox) throw new SandgymError('not_found', `No FnCall sandbox "${id}" in this process`);
    return sandbox;
  }

  async kill(id: string): Promise<void> {
    const sandbox = this.sandboxes.get(id);
    if (!sandbox) throw new SandgymError('not_found', `No FnCall sandbox "${id}" in this process`);
    await sandbox.close();
  }

  withWritableLayerOf<T>(): Promise<T> {
    return Promise.reject(new SandgymError('unsupported', 'FnCall sandboxes keep no writable layer'));
  }

  /** Its workers are containers: the container backend's gc reaps what a crash left of them. */
  gc(): Promise<GcReport> {
    return Promise.resolve({ sandboxes: [], mounts: [], cgroups: [] });
  }

  gcLayers(): Promise<{ unmounted: string[]; removedCopies: string[] }> {
    return Promise.resolve({ unmounted: [], removedCopies: [] });
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    clearInterval(this.reaper);
    for (const sandbox of this.sandboxes.values()) await sandbox.close();
    const sets = [...this.sets.values()];
    this.sets.clear();
    await Promise.allSettled(sets.map((set) => set.close()));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
