import {
  AsyncQueue,
  SandgymError,
  definedFields,
  isSandgymError,
  type FailureReason,
} from '../common/index.ts';
import { callOptionsOf } from '../backends/index.ts';
import type {
  BackendName,
  CallOptions,
  DirListing,
  ExecChunk,
  ExecOptions,
  ExecResult,
  ExecStream,
  HibernateReport,
  CheckpointOptions,
  SandboxCheckpoint,
  ListDirOptions,
  ReadFileOptions,
  SandboxResources,
  SandboxState,
  SandboxStats,
  WriteFileOptions,
  WrittenPathsOptions,
} from '../backends/index.ts';
import type { Sandbox, SandboxLayer } from './platform-client.ts';
import type { SANDBOXES, SandboxInfo, WireClient } from './wire/index.ts';

/** Slack on top of a command's own time limit before the call itself is abandoned. */
const EXEC_DEADLINE_SLACK_MS = 30_000;

/** The Sandboxes service's client. */
export type SandboxesClient = WireClient<typeof SANDBOXES>;

type Client = SandboxesClient;

/** A sandbox on some node of the cluster, driven through the wire protocol. */
export class RemoteSandbox implements Sandbox {
  readonly id: string;
  readonly backend: BackendName;
  readonly layers: readonly SandboxLayer[];
  readonly labels: Readonly<Record<string, string>>;
  readonly resources: Readonly<SandboxResources>;
  private calls = 0;
  private active = Date.now();
  private currentState: SandboxState;
  private currentFailure: FailureReason | undefined;
  private closed = false;

  constructor(
    private readonly client: Client,
    info: SandboxInfo,
    private readonly forget: (id: string) => void,
  ) {
    this.id = info.id;
    this.backend = info.backend;
    this.layers = info.layers.map(({ digest, sizeBytes }) => ({
      digest,
      ...(sizeBytes === undefined ? {} : { sizeBytes }),
    }));
    this.labels = info.labels;
    this.resources = info.resources;
    this.currentState = info.state;
    this.currentFailure = info.failure ?? undefined;
  }

  get state(): SandboxState {
    return this.currentState;
  }

  get failure(): FailureReason | undefined {
    return this.currentFailure;
  }

  private stoppedError(): SandgymError {
    return new SandgymError(
      'failed_precondition',
      `Sandbox ${this.id} is ${this.currentState}: it was closed`,
    );
  }

  private checkOpen(): void {
    if (this.closed) throw this.stoppedError();
  }

  get activeCalls(): number {
    return this.calls;
  }

  /** As this client saw it; the node reclaims idle sandboxes by its own count. */
  get lastActiveAt(): number {
    return this.calls > 0 ? Date.now() : this.active;
  }

  /** Runs a call, and records a lost node as this sandbox's failure. */
  private async guard<T>(call: () => Promise<T>): Promise<T> {
    this.checkOpen();
    this.calls++;
    this.active = Date.now();
    try {
      return await call();
    } catch (error) {
      if (error instanceof SandgymError && error.code === 'node_lost') {
        this.currentState = 'failed';
        this.currentFailure = 'node_lost';
      }
      throw error;
    } finally {
      this.calls--;
      this.active = Date.now();
    }
  }

  exec(argv: string[], options: ExecOptions = {}): Promise<ExecResult> {
    const { signal, timeoutMs } = options;
    return this.guard(() =>
      this.client.call('ExecCollected', this.execRequest(argv, options), {
        ...(signal ? { signal } : {}),
        ...(timeoutMs === undefined ? {} : { timeoutMs: timeoutMs + EXEC_DEADLINE_SLACK_MS }),
      }),
    );
  }

  /** The wire form of a command and its options. */
  private execRequest(argv: string[], options: ExecOptions): Record<string, unknown> {
    const { stdin, ...rest } = options;
    delete rest.signal; // cancellation travels as the call's own, not in the message
    return {
      sandboxId: this.id,
      argv,
      ...definedFields(rest),
      ...(stdin === undefined ? {} : { stdin: typeof stdin === 'string' ? Buffer.from(stdin) : stdin }),
    };
  }

  execStream(argv: string[], options: ExecOptions = {}): ExecStream {
    const output = new AsyncQueue<ExecChunk>();
    if (this.closed) {
      const error = this.stoppedError();
      output.end(error);
      const failed = Promise.reject(error);
      failed.catch(() => undefined); // the caller may read only the output; the error reaches it there
      return { output, result: failed };
    }
    const { signal, timeoutMs } = options;
    const events = this.client.stream('Exec', this.execRequest(argv, options), {
      ...(signal ? { signal } : {}),
      ...(timeoutMs === undefined ? {} : { timeoutMs: timeoutMs + EXEC_DEADLINE_SLACK_MS }),
    });
    const result = this.guard(async () => {
      for await (const event of events) {
        if (event.type === 'chunk') output.push({ stream: event.stream, data: Buffer.from(event.data) });
        else return event.result;
      }
      throw new SandgymError('platform_error', `The exec stream of ${this.id} ended without a result`);
    });
    result.then(
      () => output.end(),
      (error: unknown) => output.end(error),
    );
    return { output, result };
  }

  async readFile(path: string, options: ReadFileOptions = {}): Promise<Buffer> {
    const { data } = await this.guard(() =>
      this.client.call(
        'ReadFile',
        {
          sandboxId: this.id,
          path,
          ...(options.maxBytes === undefined ? {} : { maxBytes: options.maxBytes }),
          ...(options.user === undefined ? {} : { user: options.user }),
        },
        callOptionsOf(options),
      ),
    );
    return Buffer.from(data);
  }

  async writeFile(path: string, data: string | Uint8Array, options: WriteFileOptions = {}): Promise<void> {
    await this.guard(() =>
      this.client.call(
        'WriteFile',
        {
          sandboxId: this.id,
          path,
          data: typeof data === 'string' ? Buffer.from(data) : data,
          ...(options.mode === undefined ? {} : { mode: options.mode }),
          ...(options.user === undefined ? {} : { user: options.user }),
        },
        callOptionsOf(options),
      ),
    );
  }

  async listDir(path: string, options: ListDirOptions = {}): Promise<DirListing> {
    const user = options.user === undefined ? {} : { user: options.user };
    const { entries, truncated } = await this.guard(() =>
      this.client.call('ListDir', { sandboxId: this.id, path, ...user }, callOptionsOf(options)),
    );
    return truncated ? Object.assign(entries, { truncated }) : entries;
  }

  async pause(options: CallOptions = {}): Promise<void> {
    await this.guard(() => this.client.call('Pause', { sandboxId: this.id }, callOptionsOf(options)));
    this.currentState = 'paused';
  }

  async resume(options: CallOptions = {}): Promise<void> {
    await this.guard(() => this.client.call('Resume', { sandboxId: this.id }, callOptionsOf(options)));
    this.currentState = 'running';
  }

  async hibernate(options: CallOptions = {}): Promise<HibernateReport> {
    const report = await this.guard(() =>
      this.client.call('Hibernate', { sandboxId: this.id }, callOptionsOf(options)),
    );
    this.currentState = report.state;
    const { imageBytes, reason, ...measured } = report;
    return {
      ...measured,
      ...(imageBytes === undefined ? {} : { imageBytes }),
      ...(reason === undefined ? {} : { reason }),
    };
  }

  checkpoint(options: CheckpointOptions = {}): Promise<SandboxCheckpoint> {
    return this.guard(() =>
      this.client.call(
        'Checkpoint',
        { sandboxId: this.id, ...(options.depth ? { depth: options.depth } : {}) },
        callOptionsOf(options),
      ),
    );
  }

  async restore(checkpoint: SandboxCheckpoint | string, options: CallOptions = {}): Promise<void> {
    const checkpointId = typeof checkpoint === 'string' ? checkpoint : checkpoint.id;
    await this.guard(() =>
      this.client.call('RestoreCheckpoint', { sandboxId: this.id, checkpointId }, callOptionsOf(options)),
    );
    this.currentState = 'running';
  }

  async writtenPaths(prefixes: readonly string[], options: WrittenPathsOptions = {}): Promise<string[]> {
    const { paths } = await this.guard(() =>
      this.client.call(
        'WrittenPaths',
        { sandboxId: this.id, prefixes: [...prefixes], ...(options.limit ? { limit: options.limit } : {}) },
        callOptionsOf(options),
      ),
    );
    return paths;
  }

  async setNetwork(rules: readonly string[], options: CallOptions = {}): Promise<void> {
    await this.guard(() =>
      this.client.call('SetNetwork', { sandboxId: this.id, rules: [...rules] }, callOptionsOf(options)),
    );
  }

  async stats(options: CallOptions = {}): Promise<SandboxStats> {
    const { network, ...stats } = await this.guard(() =>
      this.client.call('Stats', { sandboxId: this.id }, callOptionsOf(options)),
    );
    this.currentState = stats.state;
    return network ? { ...stats, network } : stats;
  }

  markStopped(): void {
    this.closed = true;
    this.currentState = 'stopped';
    this.forget(this.id);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.client.call('Destroy', { sandboxId: this.id });
    } catch (error) {
      // gone already (killed elsewhere, or a lost node took it with it): nothing left to destroy
      if (!isSandgymError(error, 'node_lost', 'not_found')) throw error;
    } finally {
      this.currentState = 'stopped';
      this.forget(this.id);
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
