import { SandgymError, type FailureReason } from '../../common/index.ts';
import type {
  BackendSandbox,
  CallOptions,
  DirListing,
  ListDirOptions,
  ExecOptions,
  ExecResult,
  ExecStream,
  HibernateReport,
  SandboxCheckpoint,
  LayerImage,
  ReadFileOptions,
  SandboxResources,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  WriteFileOptions,
} from '../contract.ts';
import type { ContainerSandbox } from '../container/container-sandbox.ts';
import { collectExec, streamExec } from '../collect-exec.ts';
import { checkArgv, checkSandboxPath, throwIfAborted } from '../internal/checks.ts';
import { expiryOf } from '../internal/lifetime.ts';
import { isRootUser } from '../internal/users.ts';
import type { WorkerSet } from './worker-set.ts';

/** The most a FnCall sandbox may hold in files written with writeFile. */
const MAX_STAGED_BYTES = 64 * 1024 * 1024;

interface StagedFile {
  data: Uint8Array;
  mode: number;
  /** Who wrote it: it is written as that user into every worker, so it is that user's there too. */
  user?: string;
}

/**
 * A stateless sandbox: every call runs in a warm worker of its environment, which first receives
 * the files given with writeFile, and is cleaned after the call. Nothing a command writes lasts;
 * there is nothing to pause, hibernate or checkpoint.
 */
export class FnCallSandbox implements BackendSandbox {
  readonly backend = 'fncall' as const;
  readonly id: string;
  readonly createdAt = Date.now();
  private currentState: SandboxState = 'running';
  private readonly staged = new Map<string, StagedFile>();
  private stagedBytes = 0;
  private inFlight = 0;
  private active = Date.now();
  private failureReason: FailureReason | undefined;

  constructor(
    private readonly spec: SandboxSpec,
    /** Its environment's workers, looked up per call: an idle set is reaped and made again. */
    private readonly workersOf: () => WorkerSet,
    private readonly onClose: (sandbox: FnCallSandbox) => void,
  ) {
    this.id = spec.id;
  }

  get state(): SandboxState {
    return this.currentState;
  }

  get failure(): FailureReason | undefined {
    return this.failureReason;
  }

  expiresAt(): number | undefined {
    return expiryOf(this.spec.lifetime, this);
  }

  async reclaim(reason: FailureReason): Promise<void> {
    this.failureReason = reason;
    await this.close();
  }

  get layers(): readonly LayerImage[] {
    return this.spec.layers;
  }

  get labels(): Readonly<Record<string, string>> {
    return this.spec.labels;
  }

  get resources(): Readonly<SandboxResources> {
    return this.spec.resources;
  }

  get activeCalls(): number {
    return this.inFlight;
  }

  get lastActiveAt(): number {
    return this.inFlight > 0 ? Date.now() : this.active;
  }

  /** Runs `work` on a leased worker that holds this sandbox's files, then hands the worker back. */
  private async withWorker<T>(
    what: string,
    signal: AbortSignal | undefined,
    work: (worker: ContainerSandbox) => Promise<T>,
  ): Promise<T> {
    throwIfAborted(signal, what);
    if (this.currentState !== 'running') {
      throw new SandgymError(
        'failed_precondition',
        `Cannot ${what}: sandbox ${this.id} is ${this.currentState}${this.failureReason ? ` (${this.failureReason})` : ''}`,
      );
    }
    this.inFlight++;
    this.active = Date.now();
    try {
      const workers = this.workersOf();
      const worker = await workers.lease(signal);
      try {
        for (const [path, file] of this.staged)
          await worker.writeFile(path, file.data, { mode: file.mode, ...userOf(file) });
        return await work(worker);
      } finally {
        await workers.release(worker);
      }
    } finally {
      this.inFlight--;
      this.active = Date.now();
    }
  }

  exec(argv: string[], options: ExecOptions = {}): Promise<ExecResult> {
    return collectExec(this.execStream(argv, options));
  }

  execStream(argv: string[], options: ExecOptions = {}): ExecStream {
    checkArgv(argv);
    const call: ExecOptions = {
      ...options,
      cwd: options.cwd ?? this.spec.workdir,
      env: { ...this.spec.env, ...options.env },
      outputCapBytes: options.outputCapBytes ?? this.spec.resources.outputCapBytes,
    };
    return streamExec((onChunk) =>
      this.withWorker('run a command', options.signal, async (worker) => {
        const running = worker.execStream(argv, call);
        for await (const chunk of running.output) onChunk(chunk);
        return running.result;
      }),
    );
  }

  async readFile(path: string, options: ReadFileOptions = {}): Promise<Buffer> {
    checkSandboxPath(path);
    return this.withWorker('read a file', options.signal, (worker) => worker.readFile(path, options));
  }

  /**
   * Kept by the sandbox and given to every later call; written into the worker before it runs.
   * A file written as a user is written into a worker at once, so a write that user may not make
   * is refused now, as in any sandbox, and never kept.
   */
  async writeFile(path: string, data: string | Uint8Array, options: WriteFileOptions = {}): Promise<void> {
    checkSandboxPath(path);
    throwIfAborted(options.signal, 'Writing a file');
    const file: StagedFile = {
      data: typeof data === 'string' ? Buffer.from(data) : data,
      mode: options.mode ?? 0o644,
      ...userOf(options),
    };
    const previous = this.staged.get(path)?.data.length ?? 0;
    if (this.stagedBytes - previous + file.data.length > MAX_STAGED_BYTES) {
      throw new SandgymError(
        'invalid_argument',
        `A FnCall sandbox holds at most ${MAX_STAGED_BYTES} bytes of files; use a container sandbox for more`,
      );
    }
    if (!isRootUser(file.user)) {
      await this.withWorker('write a file', options.signal, (worker) =>
        worker.writeFile(path, file.data, { mode: file.mode, ...userOf(file) }),
      );
    }
    this.stagedBytes += file.data.length - (this.staged.get(path)?.data.length ?? 0);
    this.staged.set(path, file);
    this.active = Date.now();
  }

  async listDir(path: string, options: ListDirOptions = {}): Promise<DirListing> {
    checkSandboxPath(path);
    return this.withWorker('list a directory', options.signal, (worker) => worker.listDir(path, options));
  }

  private unsupported(what: string): Promise<never> {
    return Promise.reject(
      new SandgymError(
        'unsupported',
        `FnCall sandboxes are stateless and cannot ${what}; use a container sandbox`,
      ),
    );
  }

  pause(): Promise<void> {
    return this.unsupported('pause');
  }

  hibernate(): Promise<HibernateReport> {
    return this.unsupported('hibernate');
  }

  resume(): Promise<void> {
    return this.unsupported('resume');
  }

  checkpoint(): Promise<SandboxCheckpoint> {
    return this.unsupported('checkpoint');
  }

  restore(): Promise<void> {
    return this.unsupported('restore a checkpoint');
  }

  withWritableLayer<T>(): Promise<T> {
    return this.unsupported('hand over a writable layer');
  }

  /** Nothing it runs stays: no call leaves a writable layer behind. */
  writtenPaths(): Promise<string[]> {
    return Promise.resolve([]);
  }

  /** Calls run on shared workers with loopback only: there is no per-caller network to open. */
  async setNetwork(rules: readonly string[]): Promise<void> {
    if (rules.length > 0) await this.unsupported('open its network (its calls share workers)');
  }

  /**
   * The use of a worker of its environment: what one call of it gets. Measuring leases nothing
   * and starts nothing (a node measures every sandbox every second); with no worker up, nothing
   * runs for it.
   */
  async stats(options: CallOptions = {}): Promise<SandboxStats> {
    throwIfAborted(options.signal, 'Measuring its use');
    const worker = this.workersOf().anyWorker();
    const idle = {
      memoryBytes: 0,
      kernelMemoryBytes: 0,
      pids: 0,
      cpuUsageMs: 0,
      oomKills: 0,
      deniedEgress: 0,
      diskBytes: 0,
      pidsLimitHits: 0,
    };
    return { ...(worker ? await worker.stats(options) : idle), state: this.currentState };
  }

  close(): Promise<void> {
    if (this.currentState !== 'stopped') {
      this.currentState = 'stopped';
      this.staged.clear();
      this.onClose(this);
    }
    return Promise.resolve();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** The `user` of options or a staged file, when it has one. */
function userOf(from: { user?: string }): { user?: string } {
  return from.user === undefined ? {} : { user: from.user };
}
