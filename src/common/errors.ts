/**
 * The one error type of sandgym. `code` says what went wrong in a way a program can branch on,
 * `retryable` says whether the same call may succeed later, and the message names what to change.
 */
export const SANDGYM_ERROR_CODES = [
  'invalid_argument',
  'not_found',
  'already_exists',
  'failed_precondition',
  'unsupported',
  'permission_denied',
  'resource_exhausted',
  'timeout',
  'cancelled',
  'oom',
  'agent_crash',
  'admission_rejected',
  'divergence',
  // a step started on a node that died before it was recorded: it may or may not have taken effect
  'step_in_doubt',
  'unauthenticated',
  'node_lost',
  'platform_error',
] as const;

/** One of {@link SANDGYM_ERROR_CODES}. */
export type SandgymErrorCode = (typeof SANDGYM_ERROR_CODES)[number];

/** Why a sandbox failed: an infrastructure outcome, never a reward of 0. */
export type FailureReason =
  'oom' | 'timeout' | 'preempted' | 'node_lost' | 'admission_rejected' | 'agent_crash' | 'platform_error';

/** Options for {@link SandgymError}. */
export interface SandgymErrorOptions {
  retryable?: boolean;
  cause?: unknown;
}

/** Base class of every error sandgym throws on purpose. */
export class SandgymError extends Error {
  override readonly name = 'SandgymError';
  readonly code: SandgymErrorCode;
  readonly retryable: boolean;

  constructor(code: SandgymErrorCode, message: string, options: SandgymErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.retryable = options.retryable ?? false;
  }
}

/** True when `error` is a {@link SandgymError}, optionally of one of the given codes. */
export function isSandgymError(error: unknown, ...codes: SandgymErrorCode[]): error is SandgymError {
  return error instanceof SandgymError && (codes.length === 0 || codes.includes(error.code));
}

/** The message of any thrown value, for logs and wrapped errors. */
export function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
