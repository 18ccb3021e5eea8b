import { expect } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';

/** Expects `promise` to fail with a SandgymError of `code` (and a message matching `message`). */
export async function expectCode(promise: Promise<unknown>, code: string, message?: RegExp): Promise<void> {
  const error: unknown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(isSandgymError(error), `expected a SandgymError "${code}", got ${String(error)}`).toBe(true);
  expect((error as { code: string }).code).toBe(code);
  if (message) expect((error as Error).message).toMatch(message);
}
