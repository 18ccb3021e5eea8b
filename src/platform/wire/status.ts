import { Metadata, status as Status, type ServiceError, type StatusObject } from '@grpc/grpc-js';
import { SandgymError, isSandgymError, messageOf, type SandgymErrorCode } from '../../common/index.ts';

/**
 * The one table from sandgym error codes to gRPC status codes. The exact code and whether a retry
 * may succeed also travel in trailing metadata, so a sandgym client gets back the error the
 * server threw; a client in another language can branch on the status alone.
 */
export const STATUS_OF_CODE: Record<SandgymErrorCode, Status> = {
  invalid_argument: Status.INVALID_ARGUMENT,
  not_found: Status.NOT_FOUND,
  already_exists: Status.ALREADY_EXISTS,
  failed_precondition: Status.FAILED_PRECONDITION,
  unsupported: Status.UNIMPLEMENTED,
  permission_denied: Status.PERMISSION_DENIED,
  unauthenticated: Status.UNAUTHENTICATED,
  resource_exhausted: Status.RESOURCE_EXHAUSTED,
  admission_rejected: Status.RESOURCE_EXHAUSTED,
  oom: Status.RESOURCE_EXHAUSTED,
  timeout: Status.DEADLINE_EXCEEDED,
  cancelled: Status.CANCELLED,
  divergence: Status.ABORTED,
  step_in_doubt: Status.DATA_LOSS,
  node_lost: Status.UNAVAILABLE,
  agent_crash: Status.INTERNAL,
  platform_error: Status.INTERNAL,
};

/** For a status that carries no sandgym code: a peer in another language, or the transport itself. */
const CODE_OF_STATUS: Partial<Record<Status, SandgymErrorCode>> = {
  [Status.INVALID_ARGUMENT]: 'invalid_argument',
  [Status.NOT_FOUND]: 'not_found',
  [Status.ALREADY_EXISTS]: 'already_exists',
  [Status.FAILED_PRECONDITION]: 'failed_precondition',
  [Status.UNIMPLEMENTED]: 'unsupported',
  [Status.PERMISSION_DENIED]: 'permission_denied',
  [Status.UNAUTHENTICATED]: 'unauthenticated',
  [Status.RESOURCE_EXHAUSTED]: 'resource_exhausted',
  [Status.DEADLINE_EXCEEDED]: 'timeout',
  [Status.CANCELLED]: 'cancelled',
  [Status.ABORTED]: 'divergence',
  [Status.DATA_LOSS]: 'step_in_doubt',
};

const CODE_KEY = 'sandgym-code';
const RETRYABLE_KEY = 'sandgym-retryable';
/** Set on a refusal sent before the request body was read: the call never ran, so any may be sent again. */
const UNREAD_KEY = 'sandgym-unread';

const KNOWN_CODES = new Set<string>(Object.keys(STATUS_OF_CODE));

/** The status a server sends for a thrown value; anything not thrown on purpose is `platform_error`. */
export function toStatus(error: unknown): StatusObject {
  const known = isSandgymError(error) ? error : undefined;
  const code: SandgymErrorCode = known?.code ?? 'platform_error';
  const metadata = new Metadata();
  metadata.set(CODE_KEY, code);
  metadata.set(RETRYABLE_KEY, String(known?.retryable ?? false));
  return { code: STATUS_OF_CODE[code], details: messageOf(error), metadata };
}

/** `status`, marked as sent before the request body was read (see {@link wasUnread}). */
export function markUnread(status: StatusObject): StatusObject {
  status.metadata.set(UNREAD_KEY, 'true');
  return status;
}

/** Whether a server refused the call before reading its body: nothing ran, any method may be retried. */
export function wasUnread(error: ServiceError): boolean {
  return error.metadata?.get(UNREAD_KEY)[0] === 'true';
}

/**
 * The error a client raises for a failed call. `unreachable` is what UNAVAILABLE without a sandgym
 * code means to this caller: the server could not be reached (for a node, that is `node_lost`).
 */
export function fromStatus(
  error: ServiceError,
  unreachable: SandgymErrorCode = 'platform_error',
): SandgymError {
  const sent = error.metadata?.get(CODE_KEY)[0];
  const code =
    typeof sent === 'string' && KNOWN_CODES.has(sent)
      ? (sent as SandgymErrorCode)
      : error.code === Status.UNAVAILABLE
        ? unreachable
        : (CODE_OF_STATUS[error.code] ?? 'platform_error');
  const retryable =
    error.metadata?.get(RETRYABLE_KEY)[0] === 'true' || (!sent && error.code === Status.UNAVAILABLE);
  return new SandgymError(code, error.details || error.message, { retryable, cause: error });
}
