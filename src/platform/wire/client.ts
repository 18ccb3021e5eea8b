import { Client, Metadata, type CallOptions as GrpcCallOptions, type ServiceError } from '@grpc/grpc-js';
import { SandgymError, type SandgymErrorCode } from '../../common/index.ts';
import type { CallOptions } from '../../backends/index.ts';
import { decodeMessage, encodeMessage } from './decode.ts';
import { TRANSPORT_MAX_BYTES } from './server.ts';
import { methodPath, type MethodDef, type ResponseOf, type ServiceDef } from './service.ts';
import { fromStatus } from './status.ts';
import { channelCredentials, type TlsFiles } from './tls.ts';

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
}

/** Call options, plus metadata for this call only. */
export interface WireCallOptions extends CallOptions {
  metadata?: Record<string, string>;
  /** What an unreachable server means for this call, over the client's own setting. */
  unreachable?: SandgymErrorCode;
}

const identity = (bytes: Buffer): Buffer => bytes;

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
  }

  call<K extends UnaryKeys<S> & string>(
    name: K,
    request: unknown,
    options: WireCallOptions = {},
  ): Promise<ResponseOf<S['methods'][K]>> {
    const out = this.outgoing<K>(name, request, options);
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
          if (error) return reject(this.failure(error, options.unreachable));
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

  /** A server stream as an async iterable; breaking out of the loop cancels the call. */
  async *stream<K extends StreamKeys<S> & string>(
    name: K,
    request: unknown,
    options: WireCallOptions = {},
  ): AsyncGenerator<ResponseOf<S['methods'][K]>> {
    const out = this.outgoing<K>(name, request, options);
    const call = this.client.makeServerStreamRequest(
      out.path,
      identity,
      identity,
      out.body,
      out.metadata,
      out.grpc,
    );
    const cancel = cancelOnAbort(call, options.signal);
    try {
      for await (const bytes of call as AsyncIterable<Buffer>) yield out.decode(bytes);
    } catch (error) {
      if (isServiceError(error)) throw this.failure(error);
      throw asPlatformError(error);
    } finally {
      cancel.release();
      call.cancel();
    }
  }

  /** Resolves once connected, or fails with `unreachable` after `timeoutMs`. */
  waitForReady(timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) =>
      this.client.waitForReady(Date.now() + timeoutMs, (error) =>
        error
          ? reject(
              new SandgymError(
                this.options.unreachable ?? 'platform_error',
                `${this.address} is not reachable: ${error.message}`,
                {
                  retryable: true,
                },
              ),
            )
          : resolve(),
      ),
    );
  }

  close(): void {
    this.client.close();
  }

  /** Everything a call of `name` sends, and how to read what comes back. */
  private outgoing<K extends keyof S['methods'] & string>(
    name: K,
    request: unknown,
    options: WireCallOptions,
  ) {
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

  private failure(error: ServiceError, unreachable = this.options.unreachable): SandgymError {
    return fromStatus(error, unreachable);
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
