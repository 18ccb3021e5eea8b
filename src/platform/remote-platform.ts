import { SandgymError, definedFields, parseAt, settleAll } from '../common/index.ts';
import { callOptionsOf } from '../backends/index.ts';
import type { CallOptions, GcReport, SandboxRecord } from '../backends/index.ts';
import type { Environment } from './store/layer-store.ts';
import type { StepLog } from './exactly-once.ts';
import type { StepReply, StepRequest } from './steps/step-types.ts';
import type { TrajectoryRecord } from './trajectory-log.ts';
import type {
  ForkOptions,
  LayerGcOptions,
  LayerGcReport,
  PackDiffOptions,
  PackDiffResult,
  PlatformClient,
  Sandbox,
  SandboxGroup,
} from './platform-client.ts';
import { sandboxRequestSchema, type SandboxRequest } from './sandbox-request.ts';
import { RUNS, SANDBOXES, WireClient, type TlsFiles, type WireClientOptions } from './wire/index.ts';
import { remoteRun, runOptionsSchema } from './run-handles.ts';
import { forkSandbox, sandboxGroup } from './fork.ts';
import { RemoteSandbox, type SandboxesClient } from './remote-sandbox.ts';
import type { Run, RunOptions } from './runs.ts';

/** Options for {@link Platform.connect}. */
export interface ConnectOptions {
  token: string;
  /** How long to wait for the first connection, in ms. @default 10_000 */
  connectTimeoutMs?: number;
  /** Extra metadata on every call (a controller uses it to say which project it acts for). */
  metadata?: Record<string, string>;
  /**
   * TLS: the CA that signed the controller's certificate, and this client's pair where the
   * controller requires mutual TLS (`readTlsFiles` reads them). Plaintext without.
   */
  tls?: TlsFiles;
}

type Client = SandboxesClient;

const IPV4_PORT = /^\d{1,3}(?:\.\d{1,3}){3}:\d{1,5}$/;

/**
 * Parses `grpc://host:port` (or a bare `host:port`) into a gRPC target. Several controller
 * replicas, `grpc://10.0.0.1:7443,10.0.0.2:7443`, become one target that fails over between them.
 */
function parseGrpcUrl(url: string): string {
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
 * Request bodies one client has in flight at once: half a project's default budget on a server
 * (see RequestBudget), so two clients of a project rarely see their calls refused and resent.
 */
const SEND_WINDOW_BYTES = 128 * 2 ** 20;

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
    const shared: WireClientOptions = {
      token: options.token,
      sendWindowBytes: SEND_WINDOW_BYTES,
      ...(options.metadata ? { metadata: options.metadata } : {}),
      ...(options.tls ? { tls: options.tls } : {}),
      ...clientOptions,
    };
    const client = new WireClient(parseGrpcUrl(url), SANDBOXES, shared);
    const runs = new WireClient(parseGrpcUrl(url), RUNS, shared);
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

  /**
   * Leaves a sandbox this client created to outlive it: close() no longer destroys it, and its
   * lifetime (idle TTL, deadline) or a kill ends it. What `sandgym create` does on a cluster.
   */
  keep(sandbox: Sandbox): void {
    this.mine.delete(sandbox.id);
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
    const { layer, environment, present, dropped, excludedByPattern, excludedByPatternCut } =
      await this.client.call(
        'PackDiff',
        { sandboxId: typeof sandbox === 'string' ? sandbox : sandbox.id, ...definedFields(fields) },
        callOptionsOf(options),
      );
    const found = { layer, present, dropped, excludedByPattern, excludedByPatternCut };
    return environment ? { ...found, environment } : found;
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

  async fork(sandbox: Sandbox, count: number, options: ForkOptions = {}): Promise<SandboxGroup> {
    if (options.depth !== 'memory') return forkSandbox(this, sandbox, count, options);
    const { sandboxes } = await this.client.call(
      'ForkInMemory',
      {
        sandboxId: sandbox.id,
        count,
        ...(options.checkpoint === undefined
          ? {}
          : {
              checkpointId:
                typeof options.checkpoint === 'string' ? options.checkpoint : options.checkpoint.id,
            }),
      },
      callOptionsOf(options),
    );
    const copies = sandboxes.map((info) => {
      const copy = new RemoteSandbox(this.client, info, (id) => this.mine.delete(id));
      this.mine.set(copy.id, copy);
      return copy;
    });
    return sandboxGroup(copies);
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
