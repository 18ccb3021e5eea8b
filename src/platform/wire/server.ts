import {
  Server,
  type Metadata,
  type ServerUnaryCall,
  type ServerWritableStream,
  type ServiceDefinition,
  type UntypedServiceImplementation,
  type sendUnaryData,
} from '@grpc/grpc-js';
import { SandgymError, type Logger } from '../../common/index.ts';
import { decodeMessage, encodeMessage } from './decode.ts';
import {
  DEFAULT_MAX_REQUEST_BYTES,
  methodPath,
  type MethodDef,
  type RequestOf,
  type ServiceDef,
} from './service.ts';
import { toStatus } from './status.ts';
import { callGuard } from './call-guard.ts';
import { PROJECT_KEY } from './auth.ts';
import { requestResolution, type IdResolvers, type RequestResolution } from './id-resolution.ts';
import type { RequestBudget } from './request-budget.ts';
import type { Authenticate, Principal } from './principal.ts';
import { serverCredentials, type TlsFiles } from './tls.ts';

export type { Authenticate, IdResolvers, Principal };

/** Largest frame the transport accepts; each method then applies its own, smaller, limit. */
export const TRANSPORT_MAX_BYTES = 96 * 1024 * 1024;

/** What a handler gets besides the request. */
export interface CallContext {
  principal: Principal;
  /** Aborted when the client cancels or its deadline passes. */
  signal: AbortSignal;
  metadata: Metadata;
}

type Handler<M extends MethodDef> = M extends { kind: 'server_stream' }
  ? (request: RequestOf<M>, call: CallContext) => AsyncIterable<unknown>
  : (request: RequestOf<M>, call: CallContext) => Promise<unknown>;

/** The implementation of every method of a service. */
export type Handlers<S extends ServiceDef> = { [K in keyof S['methods']]: Handler<S['methods'][K]> };

/** A service and its implementation, ready to serve. */
export interface Registration {
  service: ServiceDef;
  handlers: Record<string, (request: never, call: CallContext) => AsyncIterable<unknown> | Promise<unknown>>;
  /** Resolvers of the ids only this service knows (a served env's), beside the server's own. */
  resolvers: IdResolvers;
}

/** Pairs a service with its handlers, checking their types, and the resolvers of its own kinds of id. */
export function register<S extends ServiceDef>(
  service: S,
  handlers: Handlers<S>,
  resolvers: IdResolvers = {},
): Registration {
  return { service, handlers: handlers as Registration['handlers'], resolvers };
}

/** Options for {@link WireServer.listen}. */
export interface WireServerOptions {
  authenticate: Authenticate;
  /**
   * How the ids requests carry are looked up for the caller's project, per kind: every id of a
   * request is resolved before its handler runs, and a server whose methods carry a kind of id
   * that nothing resolves does not start.
   */
  resolvers: IdResolvers;
  logger: Logger;
  tls?: TlsFiles;
  /** What the request bodies of each project's calls may hold at once. */
  budget?: RequestBudget;
}

const identity = (bytes: Buffer): Buffer => bytes;

/**
 * A gRPC server whose messages are msgpack, validated with zod before a handler sees them, with
 * every error mapped through one status table. Handlers are plain async functions.
 */
export class WireServer {
  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async listen(
    address: string,
    registrations: Registration[],
    options: WireServerOptions,
  ): Promise<WireServer> {
    const caps = new Map<string, number>();
    for (const { service } of registrations)
      for (const [name, method] of Object.entries(service.methods))
        caps.set(methodPath(service, name), method.maxRequestBytes ?? DEFAULT_MAX_REQUEST_BYTES);
    const server = new Server({
      'grpc.max_receive_message_length': Math.max(...caps.values(), DEFAULT_MAX_REQUEST_BYTES),
      'grpc.max_send_message_length': TRANSPORT_MAX_BYTES,
      // the token is checked, the body capped and its budget taken before a byte of it is read
      interceptors: [
        callGuard({ authenticate: options.authenticate, maxRequestBytes: caps, budget: options.budget }),
      ],
    });
    for (const { service, handlers, resolvers } of registrations) {
      const clash = Object.keys(resolvers).find((kind) => kind in options.resolvers);
      if (clash) throw new Error(`${service.name} and its server both resolve ${clash} ids: keep one`);
      const definition: Record<string, ServiceDefinition[string]> = {};
      const implementation: UntypedServiceImplementation = {};
      for (const [name, method] of Object.entries(service.methods)) {
        const handler = handlers[name];
        if (!handler) throw new Error(`No handler for ${service.name}.${name}`);
        const path = methodPath(service, name);
        const resolution = requestResolution(`${service.name}.${name}`, method, {
          ...options.resolvers,
          ...resolvers,
        });
        definition[name] = {
          path,
          requestStream: false,
          responseStream: method.kind === 'server_stream',
          requestSerialize: identity,
          requestDeserialize: identity,
          responseSerialize: identity,
          responseDeserialize: identity,
          originalName: name,
        };
        const prepare = (call: ServerUnaryCall<Buffer, Buffer> | ServerWritableStream<Buffer, Buffer>) =>
          prepareCall(call, method, path, options.authenticate, resolution);
        implementation[name] =
          method.kind === 'unary'
            ? (call: ServerUnaryCall<Buffer, Buffer>, callback: sendUnaryData<Buffer>) => {
                void (async () => {
                  const { request, context } = await prepare(call);
                  return encodeMessage(
                    await (handler as (r: never, c: CallContext) => Promise<unknown>)(request, context),
                  );
                })().then(
                  (response) => callback(null, response),
                  (error: unknown) => {
                    logFailure(options.logger, path, error);
                    callback(toStatus(error));
                  },
                );
              }
            : (call: ServerWritableStream<Buffer, Buffer>) => {
                void (async () => {
                  const { request, context } = await prepare(call);
                  const stream = (handler as (r: never, c: CallContext) => AsyncIterable<unknown>)(
                    request,
                    context,
                  );
                  for await (const message of stream) {
                    if (context.signal.aborted) break;
                    if (!call.write(encodeMessage(message))) await waitForDrain(call, context.signal);
                  }
                })().then(
                  () => call.end(),
                  (error: unknown) => {
                    logFailure(options.logger, path, error);
                    call.emit('error', toStatus(error));
                  },
                );
              };
      }
      server.addService(definition, implementation);
    }
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync(address, serverCredentials(options.tls), (error, bound) =>
        error
          ? reject(new SandgymError('platform_error', `Cannot listen on ${address}: ${error.message}`))
          : resolve(bound),
      ),
    );
    return new WireServer(server, port);
  }

  /** Stops taking calls, lets running ones finish for `graceMs`, then cuts the rest. */
  async close(graceMs = 2000): Promise<void> {
    await new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        this.server.forceShutdown();
        resolve();
      }, graceMs);
      this.server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /** Cuts every call at once, as a crash would (for tests and `kill`-like shutdowns). */
  forceClose(): void {
    this.server.forceShutdown();
  }
}

/**
 * What a handler gets: the caller (one allowed to call the method), and the request, decoded,
 * validated and with every id in it resolved against the caller's project.
 */
async function prepareCall(
  call: ServerUnaryCall<Buffer, Buffer> | ServerWritableStream<Buffer, Buffer>,
  method: MethodDef,
  path: string,
  authenticate: Authenticate,
  resolution: RequestResolution,
): Promise<{ request: never; context: CallContext }> {
  const principal = authenticate(call.metadata, path);
  if (method.access === 'operator' && !principal.isOperator) {
    throw new SandgymError(
      'permission_denied',
      `${path} is for the node's operator: call it with the node token and no ${PROJECT_KEY} (sandgym node drain|undrain --node HOST:PORT), never for a project`,
    );
  }
  const request = decodeMessage(
    method.request,
    call.request,
    method.maxRequestBytes ?? DEFAULT_MAX_REQUEST_BYTES,
    `request to ${path}`,
  ) as never;
  await resolution(request, principal);
  const controller = new AbortController();
  call.on('cancelled', () => controller.abort(new SandgymError('cancelled', `The client cancelled ${path}`)));
  if (call.cancelled) controller.abort(new SandgymError('cancelled', `The client cancelled ${path}`));
  return { request, context: { principal, signal: controller.signal, metadata: call.metadata } };
}

function waitForDrain(call: ServerWritableStream<Buffer, Buffer>, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      call.off('drain', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    call.once('drain', done);
    signal.addEventListener('abort', done, { once: true });
  });
}

function logFailure(logger: Logger, path: string, error: unknown): void {
  if (error instanceof SandgymError && error.code !== 'platform_error') {
    logger.debug({ path, code: error.code, message: error.message }, 'call failed');
  } else {
    logger.warn({ path, err: error }, 'call failed unexpectedly');
  }
}
