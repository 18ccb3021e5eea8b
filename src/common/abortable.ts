import { SandgymError } from './errors.ts';

/**
 * Waits for `work` until `signal` fires, then gives up waiting with `cancelled`; the work itself
 * goes on (for what must finish once started, such as a step that is recorded when it ends).
 */
export function abortable<T>(work: Promise<T>, signal: AbortSignal | undefined, what: string): Promise<T> {
  if (!signal) return work;
  return new Promise<T>((resolve, reject) => {
    const stop = (): void =>
      reject(new SandgymError('cancelled', `${what} was cancelled`, { cause: signal.reason }));
    if (signal.aborted) return stop();
    signal.addEventListener('abort', stop, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', stop));
  });
}
