import {
  Metadata,
  ServerInterceptingCall,
  status as grpcStatus,
  type ServerInterceptingCallInterface,
  type ServerInterceptor,
} from '@grpc/grpc-js';
import type { Authenticate } from './principal.ts';
import { toStatus } from './status.ts';

/**
 * What grpc-js keeps on the call it hands the first interceptor: the decoder that frames the
 * request body, and the cap it checks each message's length prefix against. Not public API; see
 * {@link capRequestBody}.
 */
interface BaseCallInternals {
  maxReceiveMessageSize?: unknown;
  decoder?: { maxReadMessageLength?: unknown };
}

/**
 * Makes the transport refuse a request body larger than `maxBytes` as soon as its 5-byte length
 * prefix arrives, before any of it is buffered. grpc-js has one receive cap per server, so this
 * lowers it on the call itself while the body is still unread (the stream stays paused until the
 * handler asks for it). It reaches into grpc-js's call object: when a version moves these fields,
 * nothing is lowered, the server-wide cap still holds, and the wire test that checks a node's
 * memory under oversized calls fails.
 */
function capRequestBody(call: ServerInterceptingCallInterface, maxBytes: number): void {
  const internals = call as unknown as BaseCallInternals;
  if (typeof internals.decoder?.maxReadMessageLength !== 'number') return;
  internals.decoder.maxReadMessageLength = maxBytes;
  if (typeof internals.maxReceiveMessageSize === 'number') internals.maxReceiveMessageSize = maxBytes;
}

/**
 * The server's first interceptor: before a byte of a request body is read, the call's token is
 * checked (a call without a valid one is refused with UNAUTHENTICATED and its body never read)
 * and the body is capped at its method's size. Unauthenticated callers can therefore neither
 * make the server buffer large bodies nor reach a handler.
 */
export function callGuard(
  authenticate: Authenticate,
  maxRequestBytes: ReadonlyMap<string, number>,
): ServerInterceptor {
  return (method, call) => {
    const cap = maxRequestBytes.get(method.path);
    if (cap !== undefined) capRequestBody(call, cap);
    return new ServerInterceptingCall(call, {
      start: (next) => {
        next({
          onReceiveMetadata: (metadata, proceed) => {
            try {
              authenticate(metadata, method.path);
            } catch (error) {
              const refusal = toStatus(error);
              call.sendStatus({
                code: refusal.code ?? grpcStatus.UNAUTHENTICATED,
                details: refusal.details ?? 'unauthenticated',
                metadata: refusal.metadata ?? new Metadata(),
              });
              return;
            }
            proceed(metadata);
          },
        });
      },
    });
  };
}
