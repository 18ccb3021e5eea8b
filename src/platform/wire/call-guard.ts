import { constants as http2 } from 'node:http2';
import {
  ServerInterceptingCall,
  status as grpcStatus,
  Metadata,
  type ServerInterceptingCallInterface,
  type ServerInterceptor,
  type StatusObject,
} from '@grpc/grpc-js';
import type { Authenticate, Principal } from './principal.ts';
import type { RequestBudget } from './request-budget.ts';
import { markUnread, toStatus } from './status.ts';

/**
 * What grpc-js keeps on the call it hands the first interceptor: the decoder that frames the
 * request body, the cap a compressed body may inflate to, and the HTTP/2 stream. Not public API;
 * see {@link guardBody}.
 */
interface BaseCallInternals {
  maxReceiveMessageSize?: unknown;
  decoder?: { write?: unknown };
  stream?: { close?: (code?: number) => void };
}

/** A gRPC message's length prefix: a compression flag byte, then the length, big-endian. */
const PREFIX_BYTES = 5;

/** A request body as its length prefix announces it. */
interface BodyPrefix {
  compressed: boolean;
  bytes: number;
}

/**
 * Calls `admit` with the request body's length prefix as soon as it arrives, before a byte of the
 * body is buffered; when `admit` answers a refusal, the body is never framed: the refusal is sent
 * and the stream reset, so the client stops sending it (the transport would otherwise read the
 * rest of it, only to drop it). A compressed body is also held to `maxBytes` once inflated.
 * This reaches into grpc-js's call object: when a version moves these fields, nothing is checked
 * here, the server-wide cap still holds, and the tests that measure a node's memory under
 * oversized calls and floods (wire, tenant, budgets) fail.
 */
function guardBody(
  call: ServerInterceptingCallInterface,
  maxBytes: number,
  admit: (prefix: BodyPrefix) => StatusObject | undefined,
): void {
  const internals = call as unknown as BaseCallInternals;
  const decoder = internals.decoder;
  if (!decoder || typeof decoder.write !== 'function') return;
  if (typeof internals.maxReceiveMessageSize === 'number') internals.maxReceiveMessageSize = maxBytes;
  const write = (decoder.write as (data: Buffer) => Buffer[]).bind(decoder);
  let prefix = Buffer.alloc(0);
  let admitted: boolean | undefined;
  decoder.write = (data: Buffer): Buffer[] => {
    if (admitted === undefined) {
      prefix = Buffer.concat([prefix, data.subarray(0, PREFIX_BYTES - prefix.length)]);
      if (prefix.length === PREFIX_BYTES) {
        const refusal = admit({ compressed: prefix[0] === 1, bytes: prefix.readUInt32BE(1) });
        admitted = refusal === undefined;
        if (refusal) {
          call.sendStatus(refusal);
          internals.stream?.close?.(http2.NGHTTP2_NO_ERROR);
        }
      }
    }
    return admitted === false ? [] : write(data);
  };
}

/** Options for {@link callGuard}. */
export interface CallGuardOptions {
  authenticate: Authenticate;
  /** Each method's largest request body, by path. */
  maxRequestBytes: ReadonlyMap<string, number>;
  /** What the bodies of a project's calls may hold at once, taken from their length prefixes. */
  budget?: RequestBudget | undefined;
}

/**
 * The server's first interceptor: before a byte of a request body is read, the call's token is
 * checked (a call without a valid one is refused with UNAUTHENTICATED and its body never read),
 * the body is capped at its method's size, and its size is taken from the project's request
 * budget, given back when the handler is done (or the call ends before it starts). A caller,
 * authenticated or not, therefore cannot make the server buffer more than its budget, however many
 * calls it makes at once.
 */
export function callGuard({ authenticate, maxRequestBytes, budget }: CallGuardOptions): ServerInterceptor {
  return (method, call) => {
    const cap = maxRequestBytes.get(method.path) ?? Number.MAX_SAFE_INTEGER;
    let principal: Principal | undefined;
    let release: (() => void) | undefined;
    let handlerStarted = false;
    const done = (): void => release?.();
    guardBody(call, cap, ({ compressed, bytes }) => {
      // a call that failed authentication was answered already: its body is dropped unread
      if (!principal)
        return { code: grpcStatus.UNAUTHENTICATED, details: 'unauthenticated', metadata: new Metadata() };
      if (bytes > cap) {
        return {
          code: grpcStatus.RESOURCE_EXHAUSTED,
          details: `Received message larger than max (${bytes} vs ${cap}): requests to ${method.path} are at most ${cap} bytes`,
          metadata: new Metadata(),
        };
      }
      try {
        // a compressed body may inflate to the method's cap
        release = budget?.take(principal.project, compressed ? cap : bytes);
        return undefined;
      } catch (error) {
        return markUnread(toStatus(error));
      }
    });
    return new ServerInterceptingCall(call, {
      start: (next) => {
        next({
          onReceiveMetadata: (metadata, proceed) => {
            try {
              principal = authenticate(metadata, method.path);
            } catch (error) {
              call.sendStatus(toStatus(error));
              return;
            }
            proceed(metadata);
          },
          // the handler starts at the half close and holds the body until it answers
          onReceiveHalfClose: (proceed) => {
            handlerStarted = true;
            proceed();
          },
          onCancel: () => {
            if (!handlerStarted) done();
          },
        });
      },
      // a unary handler is done when it answers; a stream's when its status goes
      sendMessage: (message, next) => {
        if (!method.responseStream) done();
        next(message);
      },
      sendStatus: (status, next) => {
        done();
        next(status);
      },
    });
  };
}
