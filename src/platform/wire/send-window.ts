import { SandgymError } from '../../common/index.ts';

interface Waiter {
  bytes: number;
  go: () => void;
}

/**
 * How many bytes of request bodies a client has in flight at once, given in the order its calls
 * asked: a client that limits itself this way seldom meets a server's request budget (see
 * RequestBudget), so its large calls queue here rather than being sent, refused and sent again.
 * A call larger than the whole window goes alone.
 */
export class SendWindow {
  private inFlight = 0;
  private readonly waiting: Waiter[] = [];

  constructor(private readonly windowBytes: number) {}

  /** Waits for room for `bytes`; the returned function gives it back (once). */
  async take(bytes: number, signal?: AbortSignal): Promise<() => void> {
    if (this.waiting.length === 0 && this.fits(bytes)) this.inFlight += bytes;
    else await this.queue(bytes, signal);
    let given = false;
    return () => {
      if (given) return;
      given = true;
      this.inFlight -= bytes;
      this.wake();
    };
  }

  private queue(bytes: number, signal: AbortSignal | undefined): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(new SandgymError('cancelled', 'The call was cancelled before it was sent'));
        return;
      }
      const leave = (): void => {
        const at = this.waiting.indexOf(waiter);
        if (at < 0) return;
        this.waiting.splice(at, 1);
        this.wake();
        reject(new SandgymError('cancelled', 'The call was cancelled while it waited to be sent'));
      };
      const waiter: Waiter = {
        bytes,
        go: () => {
          signal?.removeEventListener('abort', leave);
          resolve();
        },
      };
      this.waiting.push(waiter);
      signal?.addEventListener('abort', leave, { once: true });
    });
  }

  private fits(bytes: number): boolean {
    return this.inFlight === 0 || this.inFlight + bytes <= this.windowBytes;
  }

  /** Lets the calls at the head of the queue go while they fit, counting them at once. */
  private wake(): void {
    for (let next = this.waiting[0]; next && this.fits(next.bytes); next = this.waiting[0]) {
      this.waiting.shift();
      this.inFlight += next.bytes;
      next.go();
    }
  }
}
