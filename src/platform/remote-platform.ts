import {
  AsyncQueue,
  SandgymError,
  definedFields,
  isSandgymError,
  parseAt,
  settleAll,
  type FailureReason,
} from '../common/index.ts';
import { callOptionsOf } from '../backends/index.ts';
import type {
  BackendName,
  BackendSandbox,
  CallOptions,
  DirEntry,
  ExecChunk,
  ExecOptions,
  ExecResult,
  ExecStream,
  GcReport,
  HibernateReport,
  LayerImage,
  ReadFileOptions,
  SandboxRecord,
  SandboxResources,
  SandboxState,
  SandboxStats,
  WriteFileOptions,
  WrittenPathsOptions,
} from '../backends/index.ts';
import type { Environment } from './layer-store.ts';
import type { StepLog } from './exactly-once.ts';
import type { StepReply, StepRequest } from './steps/step-types.ts';
import type { TrajectoryRecord } from './trajectory-log.ts';
import type {
  LayerGcOptions,
  LayerGcReport,
  PackDiffOptions,
  PackDiffResult,
  PlatformClient,
  Sandbox,
  SandboxGroup,
} from './platform-client.ts';
import { sandboxRequestSchema, type SandboxRequest } from './sandbox-request.ts';
import { RUNS, SANDBOXES, WireClient, type SandboxInfo, type WireClientOptions } from './wire/index.ts';
import { remoteRun, runOptionsSchema } from './run-handles.ts';
import { forkSandbox } from './fork.ts';
import type { Run, RunOptions } from './runs.ts';

/** Options for {@link Platform.connect}. */
export interface ConnectOptions {
  token: string;
  /** How long to wait for the first connection. Default 10 s. */
  connectTimeoutMs?: number;
  /** Extra metadata on every call (a controller uses it to say which project it acts for). */
  metadata?: Record<string, string>;
}

/** Slack on top of a command's own time limit before the call itself is abandoned. */
const EXEC_DEADLINE_SLACK_MS = 30_000;

type Client = WireClient<typeof SANDBOXES>;

const IPV4_PORT = /^\d{1,3}(?:\.\d{1,3}){3}:\d{1,5}$/;

/**
 * Parses `grpc://host:port` (or a bare `host:port`) into a gRPC target. Several controller
 * replicas, `grpc://10.0.0.1:7443,10.0.0.2:7443`, become one target that fails over between them.
 */
export function parseGrpcUrl(url: string): string {
  const match = /^(?:grpc:\/\/)?([^/\s]+)\/?$/.exec(url);
  const addresses = match?.[1]?.split(',') ?? [];
  if (addresses.length > 1 && addresses.every((address) => IPV4_PORT.test(address))) {
    return `ipv4:${addresses.join(',')}`;
  }
  if (addresses.length !== 1 || !/^[^,:]+:\d{1,5}$/.test(addresses[0] ?? '')) {
    throw new SandgymError(
      'invalid_argument',
      `"${url}" is not a platform address; use grpc://HOST:PORT (or grpc://IP:PORT,IP:PORT for replicas)`,
    );
  }
  return addresses[0] as string;
}

/**
 * The cluster client: the same {@link PlatformClient} as the embedded platform, over gRPC to a
 * controller (or straight to one node agent). Sandboxes it creates are destroyed by close().
 */
export class RemotePlatform implements PlatformClient {
  private readonly mine = new Map<string, RemoteSandbox>();
  private isClosed = false;

  private constructor(
    private readonly client: Client,
    private readonly runs: WireClient<typeof RUNS>,
  ) {}

  static async connect(
    url: string,
    options: ConnectOptions,
    clientOptions: Partial<WireClientOptions> = {},
  ): Promise<RemotePlatform> {
    const client = new WireClient(parseGrpcUrl(url), SANDBOXES, {
      token: options.token,
      ...(options.metadata ? { metadata: options.metadata } : {}),
      ...clientOptions,
    });
    const runs = new WireClient(parseGrpcUrl(url), RUNS, {
      token: options.token,
      ...(options.metadata ? { metadata: options.metadata } : {}),
      ...clientOptions,
    });
    try {
      await client.waitForReady(options.connectTimeoutMs ?? 10_000);
    } catch (error) {
      client.close();
      runs.close();
      throw error;
    }
    return new RemotePlatform(client, runs);
  }

  /**
   * Resolves once the server is reachable (after a restart, say, when the channel may be backing
   * off between reconnects); fails, retryably, after `timeoutMs`.
   */
  ready(timeoutMs = 10_000): Promise<void> {
    return this.client.waitForReady(timeoutMs);
  }

  async createSandbox(request: SandboxRequest = {}, options: CallOptions = {}): Promise<Sandbox> {
    if (this.isClosed) throw new SandgymError('failed_precondition', 'The platform client is closed');
    // validate here too, so a bad request fails the same way as on the embedded platform
    const resolved = parseAt(sandboxRequestSchema, request, 'sandbox request');
    const info = await this.client.call('Create', { request: resolved }, callOptionsOf(options));
    const sandbox = new RemoteSandbox(this.client, info, (id) => this.mine.delete(id));
    this.mine.set(sandbox.id, sandbox);
    return sandbox;
  }

  async attachSandbox(sandboxId: string, options: CallOptions = {}): Promise<Sandbox> {
    const info = await this.client.call('Describe', { sandboxId }, callOptionsOf(options));
    return new RemoteSandbox(this.client, info, () => undefined);
  }

  async listSandboxes(options: CallOptions = {}): Promise<SandboxRecord[]> {
    return (await this.client.call('List', {}, callOptionsOf(options))).sandboxes;
  }

  async killSandbox(id: string, options: CallOptions = {}): Promise<void> {
    await this.client.call('Destroy', { sandboxId: id }, callOptionsOf(options));
    this.mine.get(id)?.markStopped();
  }

  gc(options: CallOptions = {}): Promise<GcReport> {
    return this.client.call('Gc', {}, callOptionsOf(options));
  }

  layerGc(options: LayerGcOptions = {}): Promise<LayerGcReport> {
    return this.client.call(
      'LayerGc',
      options.minAgeMs === undefined ? {} : { minAgeMs: options.minAgeMs },
      callOptionsOf(options),
    );
  }

  async listEnvironments(options: CallOptions = {}): Promise<Environment[]> {
    return (await this.client.call('ListEnvironments', {}, callOptionsOf(options))).environments;
  }

  async packDiff(sandbox: Sandbox | string, options: PackDiffOptions): Promise<PackDiffResult> {
    const fields: Partial<PackDiffOptions> = { ...options };
    delete fields.signal; // call options travel as the call's own
    delete fields.timeoutMs;
    const { layer, environment, present, dropped } = await this.client.call(
      'PackDiff',
      { sandboxId: typeof sandbox === 'string' ? sandbox : sandbox.id, ...definedFields(fields) },
      callOptionsOf(options),
    );
    return environment ? { layer, environment, present, dropped } : { layer, present, dropped };
  }

  getEnvironment(ref: string, options: CallOptions = {}): Promise<Environment> {
    return this.client.call('GetEnvironment', { ref }, callOptionsOf(options));
  }

  stepLog(sandboxId: string, options: CallOptions = {}): Promise<StepLog> {
    const client = this.client;
    return Promise.resolve({
      records: async (): Promise<readonly TrajectoryRecord[]> =>
        (await client.call('Trajectory', { sandboxId }, callOptionsOf(options))).records,
    });
  }

  async step(sandbox: Sandbox, request: StepRequest, options: CallOptions = {}): Promise<StepReply> {
    const reply = await this.client.call(
      'Step',
      {
        sandboxId: sandbox.id,
        episodeId: request.episodeId,
        stepIndex: request.stepIndex,
        action: request.action,
        ...(request.options ? { options: definedFields(request.options) } : {}),
      },
      // an answer lost with its connection leaves the step where the node left it: the caller
      // asks again once the node is back (see SandboxEnv.step)
      { ...callOptionsOf(options), unreachable: 'node_lost' },
    );
    // the node checked the action and built the result from its own types
    return reply as StepReply;
  }

  async startRun(options: RunOptions, call: CallOptions = {}): Promise<Run> {
    const valid = parseAt(runOptionsSchema, options, 'run options');
    await this.runs.call('StartRun', valid, callOptionsOf(call));
    return remoteRun(this.runs, valid.name);
  }

  fork(sandbox: Sandbox, count: number, options: CallOptions = {}): Promise<SandboxGroup> {
    return forkSandbox(this, sandbox, count, options);
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    try {
      await settleAll(
        [...this.mine.values()].map((sandbox) => sandbox.close()),
        'Some sandboxes of this client could not be destroyed',
      );
    } finally {
      this.client.close();
      this.runs.close();
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** A sandbox on some node of the cluster, driven through the wire protocol. */
class RemoteSandbox implements BackendSandbox {
  readonly id: string;
  readonly backend: BackendName;
  readonly layers: readonly LayerImage[];
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
    this.layers = info.layers.map(({ digest, path, sizeBytes }) => ({
      digest,
      path,
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
        },
        callOptionsOf(options),
      ),
    );
  }

  async listDir(path: string, options: CallOptions = {}): Promise<DirEntry[]> {
    return (
      await this.guard(() =>
        this.client.call('ListDir', { sandboxId: this.id, path }, callOptionsOf(options)),
      )
    ).entries;
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
    this.currentState = 'hibernated';
    return report;
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
    const stats = await this.guard(() =>
      this.client.call('Stats', { sandboxId: this.id }, callOptionsOf(options)),
    );
    this.currentState = stats.state;
    return stats;
  }

  withWritableLayer<T>(): Promise<T> {
    return Promise.reject(
      new SandgymError(
        'unsupported',
        `The files of remote sandbox ${this.id} live on its node; use platform.packDiff() to turn them into a layer`,
      ),
    );
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
