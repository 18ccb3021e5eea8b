import { SandgymError } from '../../common/index.ts';

interface Waiter {
  wake: () => void;
}

/**
 * Where creates wait when the cluster is full. Each project has its own FIFO; when capacity may
 * have freed, waiters are woken one project at a time in turn, so a project that floods the
 * queue cannot starve another. A woken waiter retries placement and, if it still does not fit,
 * waits again at the head of its project's line.
 */
export class FairQueue {
  private readonly lines = new Map<string, Waiter[]>();
  /** Projects in the order they get their next turn. */
  private turn: string[] = [];

  get size(): number {
    let total = 0;
    for (const line of this.lines.values()) total += line.length;
    return total;
  }

  /** Creates waiting, per project. */
  depths(): Map<string, number> {
    return new Map([...this.lines].map(([project, line]) => [project, line.length]));
  }

  /**
   * Waits for a turn. Rejects with `resource_exhausted` at the deadline and `cancelled` on abort,
   * naming what the caller can change.
   */
  wait(project: string, deadline: number, signal?: AbortSignal, front = false): Promise<void> {
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        wake: () => {
          cleanup();
          resolve();
        },
      };
      const remove = (): void => {
        const line = this.lines.get(project);
        const index = line?.indexOf(waiter) ?? -1;
        if (line && index >= 0) line.splice(index, 1);
        if (line?.length === 0) this.drop(project);
      };
      const timer = setTimeout(
        () => {
          remove();
          cleanup();
          reject(
            new SandgymError(
              'resource_exhausted',
              'No node had room before the create deadline; ask for fewer or smaller sandboxes, add nodes, or allow a longer deadline',
              { retryable: true },
            ),
          );
        },
        Math.max(0, deadline - Date.now()),
      );
      const onAbort = (): void => {
        remove();
        cleanup();
        reject(new SandgymError('cancelled', 'The create was cancelled while it waited for room'));
      };
      const cleanup = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      let line = this.lines.get(project);
      if (!line) {
        this.lines.set(project, (line = []));
        this.turn.push(project);
      }
      if (front) line.unshift(waiter);
      else line.push(waiter);
    });
  }

  /** Wakes up to `count` waiters, one project at a time in turn. */
  wake(count = Infinity): void {
    let woken = 0;
    while (woken < count && this.turn.length > 0) {
      const project = this.turn.shift() as string;
      const line = this.lines.get(project);
      const waiter = line?.shift();
      if (line && line.length > 0) this.turn.push(project);
      else this.lines.delete(project);
      if (!waiter) continue;
      waiter.wake();
      woken++;
    }
  }

  private drop(project: string): void {
    this.lines.delete(project);
    this.turn = this.turn.filter((name) => name !== project);
  }
}
