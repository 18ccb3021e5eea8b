import { randomBytes } from 'node:crypto';
import { PassThrough, type Readable, type Writable } from 'node:stream';
import {
  SandgymError,
  definedFields,
  parseAt,
  type Codec,
  type SandgymErrorCode,
} from '../../common/index.ts';
import type { CallOptions, ExecChunk } from '../contract.ts';
import {
  MAX_FRAME_BYTES,
  agentMessageSchema,
  type AgentExit,
  type AgentOk,
  type AgentReady,
} from './agent-protocol.ts';
import { FrameReader, frame, replyIdOf, type OversizedFrame } from './frame-reader.ts';

type OutputHandler = (stream: ExecChunk['stream'], data: Buffer) => void;

/** The stream each output fd of the agent's `out` messages carries. */
const OUTPUT_STREAMS = { 1: 'stdout', 2: 'stderr', 3: 'report' } as const;

interface Pending {
  resolve(message: AgentOk | AgentExit): void;
  reject(error: Error): void;
  onOutput?: OutputHandler;
}

/**
 * How the agent's error codes read to callers. An error the agent answers with is about what the
 * sandbox holds or may use (a missing file, a full disk, its pids limit), never a platform fault,
 * so even an unknown code reads as a failed precondition: an agent in a sandbox must not be able
 * to turn its own failure into an infrastructure outcome.
 */
const AGENT_ERROR_CODES: Record<string, SandgymErrorCode> = {
  invalid_path: 'invalid_argument',
  bad_request: 'invalid_argument',
  not_found: 'not_found',
  permission_denied: 'permission_denied',
  path_escape: 'permission_denied',
  is_directory: 'failed_precondition',
  not_directory: 'failed_precondition',
  not_regular_file: 'failed_precondition',
  file_too_large: 'resource_exhausted',
  no_space: 'resource_exhausted',
  busy: 'resource_exhausted',
  no_resources: 'resource_exhausted',
  io_error: 'failed_precondition',
  reply_too_large: 'resource_exhausted',
};

/** Drops undefined fields: msgpack has no such type, and encoders disagree on how to send it. */

/** A request the host sends; the agent reads the fields its op needs. */
export type AgentRequest = Record<string, unknown> & { op: string };

/**
 * The host end of the agent channel: framed msgpack over the pipes the sandbox's first process
 * inherited. Requests carry ids, so any number of commands and file calls may be in flight.
 */
/** Options for {@link AgentChannel}. */
export interface AgentChannelOptions {
  /**
   * For a channel reopened to a running agent: drop everything before these bytes, which the
   * agent writes in answer to {@link AgentChannel.sync}. What comes before is a dead owner's.
   */
  resyncMarker?: Buffer;
  /** The first request id; a reopened channel starts far from its predecessor's ids. */
  firstId?: number;
}

/** Requests in flight taken out of one channel for another (see {@link AgentChannel.releaseInFlight}). */
export interface InFlight {
  pending: ReadonlyMap<number, Pending>;
  nextId: number;
}

export class AgentChannel {
  readonly ready: Promise<AgentReady>;
  /** Resolves when the agent's side of the channel closed: the agent is gone. */
  readonly closed: Promise<void>;
  private resyncMarker: Buffer | undefined;
  private skipped = Buffer.alloc(0);
  private readonly pending = new Map<number, Pending>();
  private readonly reader = new FrameReader(MAX_FRAME_BYTES);
  private nextId = 1;
  private closedError: Error | undefined;
  private protocol = 0;
  private settleReady!: { resolve(ready: AgentReady): void; reject(error: Error): void };

  constructor(
    private readonly input: Writable,
    output: Readable,
    private readonly codec: Codec,
    options: AgentChannelOptions = {},
  ) {
    this.ready = new Promise<AgentReady>((resolve, reject) => (this.settleReady = { resolve, reject }));
    this.ready.catch(() => undefined); // observed by whoever awaits it; never an unhandled rejection
    this.resyncMarker = options.resyncMarker;
    this.nextId = options.firstId ?? 1;
    output.on('data', (chunk: Buffer) => this.receive(chunk));
    this.closed = new Promise((resolve) => output.once('close', () => resolve()));
    output.on('close', () =>
      this.fail(new SandgymError('agent_crash', 'The sandbox agent closed its channel')),
    );
    output.on('error', (error) =>
      this.fail(new SandgymError('agent_crash', 'The agent channel failed', { cause: error })),
    );
    input.on('error', (error) =>
      this.fail(new SandgymError('agent_crash', 'The agent channel failed', { cause: error })),
    );
  }

  /** Requests waiting for their answer. */
  get pendingCount(): number {
    return this.pending.size;
  }

  /**
   * The protocol its agent speaks, from its ready message or its answer to a sync (an agent
   * before version 2 answered a sync without one: 1); 0 until either arrives.
   */
  get agentVersion(): number {
    return this.protocol;
  }

  /** True once the channel is gone. */
  get isClosed(): boolean {
    return this.closedError !== undefined;
  }

  /**
   * Sends a file or control request and resolves with the agent's `ok` reply. An abort or the
   * deadline rejects the call at once; the agent's late answer is then dropped.
   */
  async call(request: AgentRequest, options: CallOptions = {}): Promise<AgentOk> {
    const { id, reply } = this.send(request);
    const { signal, timeoutMs } = options;
    if (!signal && timeoutMs === undefined) return reply as Promise<AgentOk>;
    const giveUp = (error: SandgymError): void => this.forget(id, error);
    const onAbort = (): void =>
      giveUp(new SandgymError('cancelled', `Agent request "${request.op}" was cancelled`));
    signal?.addEventListener('abort', onAbort, { once: true });
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(
            () =>
              giveUp(
                new SandgymError(
                  'timeout',
                  `Agent request "${request.op}" took longer than ${timeoutMs} ms`,
                  { retryable: true },
                ),
              ),
            timeoutMs,
          );
    try {
      return (await reply) as AgentOk;
    } finally {
      signal?.removeEventListener('abort', onAbort);
      clearTimeout(timer);
    }
  }

  /** Starts a command; output arrives through `onOutput`, the result when it ends. */
  exec(request: AgentRequest, onOutput: OutputHandler): { id: number; exit: Promise<AgentExit> } {
    const { id, reply } = this.send(request, onOutput);
    return { id, exit: reply as Promise<AgentExit> };
  }

  /** Asks the agent to kill a running command. */
  cancel(id: number): void {
    if (!this.isClosed) this.send({ op: 'cancel', target: id }).reply.catch(() => undefined);
  }

  /** Rejects everything in flight. Later calls fail at once with the same error. */
  fail(error: Error): void {
    if (this.closedError) return;
    this.closedError = error;
    this.settleReady.reject(error);
    for (const pending of this.pending.values()) pending.reject(error);
    this.pending.clear();
    this.input.destroy();
  }

  private send(
    request: AgentRequest,
    onOutput?: OutputHandler,
  ): { id: number; reply: Promise<AgentOk | AgentExit> } {
    const id = this.nextId++;
    const closed = this.closedError;
    if (closed) return { id, reply: Promise.reject(closed) };
    const reply = new Promise<AgentOk | AgentExit>((resolve, reject) => {
      this.pending.set(id, onOutput ? { resolve, reject, onOutput } : { resolve, reject });
      // the id goes first: an agent that cannot parse the rest can still say which request failed
      this.input.write(frame(this.codec.encode(definedFields({ id, ...request }))));
    });
    return { id, reply };
  }

  /**
   * Takes the requests in flight out of this channel, which then holds none (so failing it fails
   * none of them): for a successor channel to the same agent, reached anew after its VM was
   * stopped and started again from its memory (see {@link AgentChannel.adoptInFlight}).
   */
  releaseInFlight(): InFlight {
    const held = { pending: new Map(this.pending), nextId: this.nextId };
    this.pending.clear();
    return held;
  }

  /** Carries on requests another channel to this agent started: their answers arrive here. */
  adoptInFlight(held: InFlight): void {
    for (const [id, pending] of held.pending) this.pending.set(id, pending);
    this.nextId = Math.max(this.nextId, held.nextId);
  }

  /** Forgets a request whose caller gave up, so its late answer is dropped. */
  forget(id: number, error: Error): void {
    const pending = this.pending.get(id);
    this.pending.delete(id);
    pending?.reject(error);
  }

  /** Proves a reopened channel works: the agent echoes the marker, then replies. */
  async sync(timeoutMs: number): Promise<void> {
    if (!this.resyncMarker) throw new SandgymError('failed_precondition', 'This channel was not reopened');
    const reply = await this.call({ op: 'sync', data: this.resyncMarker }, { timeoutMs });
    this.protocol = reply.version ?? 1;
  }

  /**
   * Tells the agent that the sandbox's processes came back from a memory image (a fork, a
   * restore, a wake from hibernation): a fresh fork value, which it writes to /run/sandgym/fork
   * and gives every later command as SANDGYM_FORK, so copies can tell themselves apart and
   * reseed; with `kernel` (a VM, whose kernel came back too), also the time and fresh entropy for
   * its random pool. An agent before protocol 2 knows no fork: it gets only what it knew.
   */
  async restored(options: { kernel: boolean; timeoutMs: number }): Promise<void> {
    const fork = this.protocol >= 2 ? { fork: randomBytes(16).toString('hex') } : {};
    const kernel = options.kernel ? { timeMs: Date.now(), data: randomBytes(64) } : {};
    if (!options.kernel && !('fork' in fork)) return;
    await this.call({ op: 'restored', ...fork, ...kernel }, { timeoutMs: options.timeoutMs });
  }

  /** Asks the agent to end every process of the sandbox and exit; best effort. */
  async shutdown(timeoutMs: number): Promise<void> {
    if (this.isClosed) return;
    await this.call({ op: 'shutdown' }, { timeoutMs }).catch(() => undefined);
  }

  private receive(chunk: Buffer): void {
    if (this.resyncMarker) {
      const seen = Buffer.concat([this.skipped, chunk]);
      const at = seen.indexOf(this.resyncMarker);
      if (at < 0) {
        // keep only what could be the start of a marker split across chunks
        this.skipped = seen.subarray(Math.max(0, seen.length - this.resyncMarker.length + 1));
        return;
      }
      chunk = seen.subarray(at + this.resyncMarker.length);
      this.resyncMarker = undefined;
      this.skipped = Buffer.alloc(0);
    }
    try {
      for (const body of this.reader.push(chunk))
        if (Buffer.isBuffer(body)) this.dispatch(body);
        else this.dropOversized(body);
    } catch (error) {
      this.fail(error instanceof Error ? error : new Error(String(error)));
    }
  }

  /** A reply too large to take fails its own call; the channel and every other call go on. */
  private dropOversized(body: OversizedFrame): void {
    const id = replyIdOf(body.head);
    const pending = id === undefined ? undefined : this.pending.get(id);
    if (id === undefined || !pending) return;
    this.pending.delete(id);
    pending.reject(
      new SandgymError(
        'resource_exhausted',
        `The sandbox agent's ${body.oversized}-byte reply is over the ${MAX_FRAME_BYTES}-byte frame limit`,
      ),
    );
  }

  private dispatch(body: Buffer): void {
    const message = parseAt(agentMessageSchema, this.codec.decode(body), 'message from the sandbox agent');
    if (message.t === 'ready') {
      this.protocol = message.version;
      return this.settleReady.resolve(message);
    }
    const pending = this.pending.get(message.id);
    if (!pending) return; // the caller gave up on it (abort); a late answer is dropped
    switch (message.t) {
      case 'out':
        pending.onOutput?.(OUTPUT_STREAMS[message.fd], Buffer.from(message.data));
        return;
      case 'error':
        this.pending.delete(message.id);
        pending.reject(
          new SandgymError(
            AGENT_ERROR_CODES[message.code] ?? 'failed_precondition',
            message.code === 'no_space'
              ? `${message.message}: the sandbox's disk is full (free space in it, or ask for more with resources.diskMib)`
              : message.message,
          ),
        );
        return;
      default:
        this.pending.delete(message.id);
        pending.resolve(message);
    }
  }
}

/** A channel with no agent behind it, closed from the start: a hibernated sandbox's until its restore. */
export function closedChannel(codec: Codec): AgentChannel {
  const output = new PassThrough();
  const channel = new AgentChannel(new PassThrough(), output, codec);
  output.destroy();
  return channel;
}
