import { SandgymError } from '../common/index.ts';

/**
 * A time budget for a piece of work made of many calls (grading: staging files, running the
 * tests, reading the reward), so that every call, not only the long one, is bounded by what is
 * left of it.
 */
export class Deadline {
  private constructor(
    private readonly endsAt: number,
    /** The whole budget, for messages. */
    readonly budgetMs: number,
    private readonly what: string,
  ) {}

  /** A deadline `budgetMs` from now for `what` ("grading task X"). */
  static after(budgetMs: number, what: string): Deadline {
    return new Deadline(Date.now() + budgetMs, budgetMs, what);
  }

  /** Milliseconds left, at least 1 while any are. */
  remainingMs(): number {
    return Math.max(0, Math.ceil(this.endsAt - Date.now()));
  }

  /** Options for the next call: what is left; `timeout` when nothing is. */
  call(capMs?: number): { timeoutMs: number } {
    const left = this.remainingMs();
    if (left <= 0)
      throw new SandgymError('timeout', `${this.what} ran out of its ${this.budgetMs} ms`, {
        retryable: false,
      });
    return { timeoutMs: capMs === undefined ? left : Math.min(left, capMs) };
  }
}
