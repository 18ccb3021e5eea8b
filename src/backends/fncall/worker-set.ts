import { SandgymError, messageOf, type Logger } from '../../common/index.ts';
import type { SandboxSpec } from '../contract.ts';
import type { ContainerBackend } from '../container/container-backend.ts';
import type { ContainerSandbox } from '../container/container-sandbox.ts';

/** Warm containers that serve the calls of one environment (one layer stack, limits and CPU class). */
export class WorkerSet {
  private readonly idle: ContainerSandbox[] = [];
  /** Every worker, idle or leased. */
  private readonly all = new Set<ContainerSandbox>();
  private readonly waiting: Array<(worker: ContainerSandbox | Error) => void> = [];
  private size = 0;
  private lastUsed = Date.now();

  constructor(
    private readonly containers: ContainerBackend,
    private readonly template: () => SandboxSpec,
    private readonly maxWorkers: number,
    private readonly logger: Logger,
  ) {}

  /** True when nothing is leased and nothing was for `ms`. */
  idleFor(ms: number): boolean {
    return this.idle.length === this.size && Date.now() - this.lastUsed > ms;
  }

  /** A worker for one call: an idle one, a new one while below the cap, else the next released. */
  async lease(signal?: AbortSignal): Promise<ContainerSandbox> {
    this.lastUsed = Date.now();
    const ready = this.idle.pop();
    if (ready) return ready;
    if (this.size < this.maxWorkers) {
      this.size++;
      try {
        return this.added(await this.containers.create(this.template(), signal ? { signal } : {}));
      } catch (error) {
        this.size--;
        throw error;
      }
    }
    return new Promise<ContainerSandbox>((resolve, reject) => {
      const waiter = (worker: ContainerSandbox | Error): void => {
        signal?.removeEventListener('abort', onAbort);
        if (worker instanceof Error) reject(worker);
        else resolve(worker);
      };
      const onAbort = (): void => {
        const at = this.waiting.indexOf(waiter);
        if (at >= 0) this.waiting.splice(at, 1);
        reject(new SandgymError('cancelled', 'The call was cancelled while it waited for a worker'));
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(waiter);
    });
  }

  private added(worker: ContainerSandbox): ContainerSandbox {
    this.all.add(worker);
    return worker;
  }

  /** Some worker of the set, leased or not, without leasing it: what measuring looks at. */
  anyWorker(): ContainerSandbox | undefined {
    return this.all.values().next().value;
  }

  /**
   * Takes a worker back after a call. Best-effort cleanup first: when the call left anything (a
   * stray process, a written file, shared memory), the worker gets a fresh root; a worker that
   * cannot be cleaned is destroyed and replaced on demand.
   */
  async release(worker: ContainerSandbox): Promise<void> {
    this.lastUsed = Date.now();
    try {
      if (await this.containers.reuse.holdsState(worker)) await this.containers.reuse.renewRoot(worker);
    } catch (error) {
      this.logger.warn(
        { id: worker.id, error: messageOf(error) },
        'cannot clean a FnCall worker; replacing it',
      );
      this.size--;
      this.all.delete(worker);
      await worker.close().catch(() => undefined);
      this.wakeWithNewWorker();
      return;
    }
    const waiter = this.waiting.shift();
    if (waiter) waiter(worker);
    else this.idle.push(worker);
  }

  private wakeWithNewWorker(): void {
    const waiter = this.waiting.shift();
    if (!waiter) return;
    this.size++;
    this.containers.create(this.template()).then(
      (worker) => waiter(this.added(worker)),
      (error: unknown) => {
        this.size--;
        waiter(error instanceof Error ? error : new Error(messageOf(error)));
      },
    );
  }

  /** Destroys every worker; calls still waiting fail. */
  async close(): Promise<void> {
    for (const waiter of this.waiting.splice(0)) {
      waiter(new SandgymError('failed_precondition', 'The FnCall backend is closed'));
    }
    const workers = this.idle.splice(0);
    this.size -= workers.length;
    for (const worker of workers) this.all.delete(worker);
    await Promise.allSettled(workers.map((w) => w.close()));
  }
}
