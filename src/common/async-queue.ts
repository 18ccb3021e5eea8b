import { messageOf } from './errors.ts';

/** A single-consumer queue exposed as an AsyncIterable: the producer pushes, then ends or fails it. */
export class AsyncQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private waiter: (() => void) | undefined;
  private done = false;
  private error: Error | undefined;

  push(item: T): void {
    this.items.push(item);
    this.wake();
  }

  end(error?: unknown): void {
    this.done = true;
    this.error = error === undefined || error instanceof Error ? error : new Error(messageOf(error));
    this.wake();
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.done) {
        if (this.error !== undefined) throw this.error;
        return;
      }
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }
}
