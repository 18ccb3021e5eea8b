import { setTimeout as sleep } from 'node:timers/promises';
import {
  Client,
  Metadata,
  connectivityState,
  type CallOptions as GrpcCallOptions,
  type ServiceError,
} from '@grpc/grpc-js';
import { SandgymError, type SandgymErrorCode } from '../../common/index.ts';
import type { CallOptions } from '../../backends/index.ts';
import { decodeMessage, encodeMessage } from './decode.ts';
import { TRANSPORT_MAX_BYTES } from './server.ts';
import { methodPath, type MethodDef, type ResponseOf, type ServiceDef } from './service.ts';
import { SendWindow } from './send-window.ts';
import { fromStatus, wasUnread } from './status.ts';
import { channelCredentials, type TlsFiles } from './tls.ts';
import { tlsMismatch } from './tls-diagnosis.ts';

/** Options for {@link WireClient}. */
export interface WireClientOptions {
  /** Sent as `authorization: Bearer <token>`. */
  token?: string;
  /** Extra metadata on every call (e.g. the project a controller acts for). */
  metadata?: Record<string, string>;
  /** What UNAVAILABLE means to this caller: `node_lost` when talking to a node agent. */
  unreachable?: SandgymErrorCode;
  /** TLS to the server (and this client's certificate, for mutual TLS); plaintext without. */
  tls?: TlsFiles;
  /**
   * Bytes of request bodies this client sends at once; larger calls wait their turn here (see
   * SendWindow). A client acting for one project sets it; one shared by many (a controller's) must
   * not, or one project's calls would queue behind another's. @default no limit
   */
  sendWindowBytes?: number;
}

/** Call options, plus metadata for this call only. */
export interface WireCallOptions extends CallOptions {
  metadata?: Record<string, string>;
  /** What an unreachable server means for this call, over the client's own setting. */
  unreachable?: SandgymErrorCode;
}

const identity = (bytes: Buffer): Buffer => bytes;

/**
 * Pauses before sending again a call that a server refused unread (its project's request budget
 * was full): they grow from the first to the longest, jittered.
 */
const FIRST_RESEND_MS = 25;
const LONGEST_RESEND_MS = 1_000;

type UnaryKeys<S extends ServiceDef> = {
  [K in keyof S['methods']]: S['methods'][K] extends { kind: 'unary' } ? K : never;
}[keyof S['methods']];
type StreamKeys<S extends ServiceDef> = {
  [K in keyof S['methods']]: S['methods'][K] extends { kind: 'server_stream' } ? K : never;
}[keyof S['methods']];

/**
 * A typed client for one service at one address: requests go out as msgpack, responses are
 * validated against the method's schema, failures come back as SandgymErrors.
 */
export class WireClient<S extends ServiceDef> {
  private readonly client: Client;
  private readonly window: SendWindow | undefined;

  constructor(
    readonly address: string,
    private readonly service: S,
    private readonly options: WireClientOptions = {},
  ) {
    this.client = new Client(address, channelCredentials(options.tls), {
      'grpc.max_receive_message_length': TRANSPORT_MAX_BYTES,
      'grpc.max_send_message_length': TRANSPORT_MAX_BYTES,
      // a restarted peer is back within seconds: do not back off for minutes
      'grpc.initial_reconnect_backoff_ms': 200,
      'grpc.max_reconnect_backoff_ms': 2_000,
    });
    this.window = options.sendWindowBytes === undefined ? undefined : new SendWindow(options.sendWindowBytes);
  }

  async call<K extends UnaryKeys<S> & string>(
    name: K,
    request: unknown,
    options: WireCallOptions = {},
  ): Promise<ResponseOf<S['methods'][K]>> {
    const out = this.outgoing<K>(name, request, options);
    const resend = new Resend(options);
    const sent = await this.window?.take(out.body.length, options.signal);
    try {
      for (;;) {
        try {
          return await this.callOnce(out, options);
        } catch (error) {
          if (!(await resend.after(error))) throw this.failure(error, options.unreachable);
        }
      }
    } finally {
      sent?.();
    }
  }

  private callOnce<K extends UnaryKeys<S> & string>(
    out: Outgoing<S, K>,
    options: WireCallOptions,
  ): Promise<ResponseOf<S['methods'][K]>> {
    return new Promise((resolve, reject) => {
      const call = this.client.makeUnaryRequest(
        out.path,
        identity,
        identity,
        out.body,
        out.metadata,
        out.grpc,
        (error: ServiceError | null, response?: Buffer) => {
          cancel.release();
          if (error) return reject(error);
          try {
            resolve(out.decode(response ?? Buffer.alloc(0)));
          } catch (decodeError) {
            reject(asPlatformError(decodeError));
          }
        },
      );
      const cancel = cancelOnAbort(call, options.signal);
    });
  }

  /**
   * A server stream as an async iterable; breaking out of the loop cancels the call. A stream
   * refused unread before its first message is sent again, as a unary call is.
   */
  async *stream<K extends StreamKeys<S> & string>(
    name: K,
    request: unknown,
    options: WireCallOptions = {},
  ): AsyncGenerator<ResponseOf<S['methods'][K]>> {
    const out = this.outgoing<K>(name, request, options);
    const resend = new Resend(options);
    const sent = await this.window?.take(out.body.length, options.signal);
    try {
      yield* this.streamOnce(out, resend, options);
    } finally {
      sent?.();
    }
  }

  private async *streamOnce<K extends StreamKeys<S> & string>(
    out: Outgoing<S, K>,
    resend: Resend,
    options: WireCallOptions,
  ): AsyncGenerator<ResponseOf<S['methods'][K]>> {
    for (;;) {
      const call = this.client.makeServerStreamRequest(
        out.path,
        identity,
        identity,
        out.body,
        out.metadata,
        out.grpc,
      );
      const cancel = cancelOnAbort(call, options.signal);
      let started = false;
      try {
        for await (const bytes of call as AsyncIterable<Buffer>) {
          started = true;
          yield out.decode(bytes);
        }
        return;
      } catch (error) {
        if (!started && (await resend.after(error))) continue;
        throw isServiceError(error) ? this.failure(error) : asPlatformError(error);
      } finally {
        cancel.release();
        call.cancel();
      }
    }
  }

  /**
   * Resolves once connected, or fails with `unreachable` after `timeoutMs`. A TLS mismatch (see
   * tlsMismatch) fails at the first failed connection instead, naming its cause, for no wait
   * would cure it.
   */
  async waitForReady(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    const watch = new AbortController();
    try {
      await Promise.race([
        new Promise<void>((resolve, reject) =>
          this.client.waitForReady(deadline, (error) =>
            error
              ? reject(
                  new SandgymError(
                    this.options.unreachable ?? 'platform_error',
                    `${this.address} is not reachable: ${error.message}`,
                    { retryable: true },
                  ),
                )
              : resolve(),
          ),
        ),
        this.failOnTlsMismatch(deadline, watch.signal),
      ]);
    } finally {
      watch.abort();
    }
  }

  /** Rejects once a failed connection turns out to be a TLS mismatch; never resolves. */
  private async failOnTlsMismatch(deadline: number, signal: AbortSignal): Promise<never> {
    const channel = this.client.getChannel();
    const never = new Promise<never>(() => undefined);
    let probed = false;
    for (;;) {
      const state = channel.getConnectivityState(false);
      if (state === connectivityState.READY || state === connectivityState.SHUTDOWN) return never;
      if (state === connectivityState.TRANSIENT_FAILURE && !probed) {
        // once: what is not a mismatch now is a fault that reconnecting may cure
        probed = true;
        const cause = await tlsMismatch(this.address, this.options.tls);
        if (cause && !signal.aborted) {
          throw new SandgymError('failed_precondition', `${this.address} refuses this connection: ${cause}`);
        }
      }
      if (signal.aborted) return never;
      // the next change of state, or the deadline: the other side of the race says what it means
      const changed = await new Promise<boolean>((resolve) =>
        channel.watchConnectivityState(state, deadline, (error) => resolve(!error)),
      );
      if (!changed || signal.aborted) return never;
    }
  }

  close(): void {
    this.client.close();
  }

  /** Everything a call of `name` sends, and how to read what comes back. */
  private outgoing<K extends keyof S['methods'] & string>(
    name: K,
    request: unknown,
    options: WireCallOptions,
  ): Outgoing<S, K> {
    const method = this.method(name);
    const path = methodPath(this.service, name);
    return {
      path,
      body: encodeMessage(request),
      metadata: this.metadata(options.metadata),
      grpc: this.grpcOptions(options),
      decode: (bytes: Uint8Array) =>
        decodeMessage(method.response, bytes, TRANSPORT_MAX_BYTES, `response of ${path}`) as ResponseOf<
          S['methods'][K]
        >,
    };
  }

  private method(name: string): MethodDef {
    const method = this.service.methods[name];
    if (!method) throw new SandgymError('unsupported', `${this.service.name} has no method ${name}`);
    return method;
  }

  private metadata(extra: Record<string, string> = {}): Metadata {
    const metadata = new Metadata();
    if (this.options.token) metadata.set('authorization', `Bearer ${this.options.token}`);
    for (const [key, value] of Object.entries({ ...this.options.metadata, ...extra }))
      metadata.set(key, value);
    return metadata;
  }

  private grpcOptions(options: CallOptions): GrpcCallOptions {
    return options.timeoutMs === undefined ? {} : { deadline: Date.now() + options.timeoutMs };
  }

  private failure(error: unknown, unreachable = this.options.unreachable): SandgymError {
    if (error instanceof SandgymError) return error;
    return isServiceError(error) ? fromStatus(error, unreachable) : asPlatformError(error);
  }
}

/** One call as it goes out, encoded once however often it is sent. */
interface Outgoing<S extends ServiceDef, K extends keyof S['methods']> {
  path: string;
  body: Buffer;
  metadata: Metadata;
  grpc: GrpcCallOptions;
  decode: (bytes: Uint8Array) => ResponseOf<S['methods'][K]>;
}

/**
 * When to send again a call that a server refused before reading it (see wasUnread): it never
 * ran, so whatever its method, it goes again after a growing, jittered pause, for as long as the
 * caller's own deadline and signal allow. A server's budget frees as its calls end, so a caller
 * that waits gets its turn, the way it would in a queue.
 */
class Resend {
  private readonly until: number;
  private pauseMs = FIRST_RESEND_MS;

  constructor(private readonly options: CallOptions) {
    this.until = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
  }

  /** Waits and says true when the call failed unread and may go again; false otherwise. */
  async after(error: unknown): Promise<boolean> {
    if (!isServiceError(error) || !wasUnread(error) || this.options.signal?.aborted) return false;
    const pause = Math.min(this.pauseMs, LONGEST_RESEND_MS) * (0.5 + Math.random());
    if (Date.now() + pause > this.until) return false;
    this.pauseMs *= 2;
    await sleep(pause, undefined, this.options.signal ? { signal: this.options.signal } : {}).catch(
      () => undefined,
    );
    return !this.options.signal?.aborted;
  }
}

/** Cancels the call when `signal` aborts (at once if it already has), until released. */
function cancelOnAbort(call: { cancel(): void }, signal: AbortSignal | undefined): { release(): void } {
  const cancel = (): void => call.cancel();
  if (signal?.aborted) cancel();
  signal?.addEventListener('abort', cancel, { once: true });
  return { release: () => signal?.removeEventListener('abort', cancel) };
}

function isServiceError(error: unknown): error is ServiceError {
  return (
    error instanceof Error && typeof (error as Partial<ServiceError>).code === 'number' && 'metadata' in error
  );
}

function asPlatformError(error: unknown): SandgymError {
  return error instanceof SandgymError
    ? new SandgymError('platform_error', `The server sent a malformed message: ${error.message}`)
    : new SandgymError('platform_error', String(error));
}
