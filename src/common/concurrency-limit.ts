/**
 * Runs at most `limit` tasks at once; the rest wait their turn in order. What keeps a burst of
 * heavy host work (a CRIU dump per sandbox of a preempted run) from starting all at once.
 */
export class ConcurrencyLimit {
  private running = 0;
  private readonly waiting: { turn: () => void; key: object | undefined }[] = [];

  constructor(private readonly limit: number) {}

  /** Runs `task` in its turn; `key` names it to {@link hurry} while it waits. */
  async run<T>(task: () => Promise<T>, key?: object): Promise<T> {
    if (this.running >= this.limit) await new Promise<void>((turn) => this.waiting.push({ turn, key }));
    else this.running++;
    try {
      return await task();
    } finally {
      const next = this.waiting.shift();
      if (next) next.turn();
      else this.running--;
    }
  }

  /**
   * Moves the waiting task of `key` to the front: someone waits on it now (a request for a
   * sandbox whose restore a phase change queued behind the run's others).
   */
  hurry(key: object): void {
    const at = this.waiting.findIndex((waiter) => waiter.key === key);
    if (at > 0) this.waiting.unshift(...this.waiting.splice(at, 1));
  }
}
