import { isSandgymError, messageOf } from '../common/index.ts';

/** Exit codes, as the README gives them: 0 success, 1 the command's own failure, 2 bad usage or input, 3 infrastructure. */
export const EXIT = { ok: 0, failed: 1, usage: 2, infrastructure: 3 } as const;

/** A usage error: the message names the argument to change. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** The exit code and one-line message for an error that reached the top. */
export function describeFailure(error: unknown): { code: number; message: string } {
  if (error instanceof UsageError) return { code: EXIT.usage, message: error.message };
  if (
    isSandgymError(error, 'invalid_argument', 'not_found', 'unsupported', 'already_exists', 'unauthenticated')
  ) {
    return { code: EXIT.usage, message: error.message };
  }
  if (isSandgymError(error))
    return { code: EXIT.infrastructure, message: `${error.message} [${error.code}]` };
  return { code: EXIT.infrastructure, message: messageOf(error) };
}
