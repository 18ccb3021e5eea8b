import { SandgymError } from '../../common/index.ts';
import { collectGarbageSoon } from './collect-garbage.ts';

const MIB = 2 ** 20;

/** What one project's calls may hold of request bodies at once on a server, unless told otherwise. */
export const DEFAULT_IN_FLIGHT_BYTES = 256 * MIB;

/** Options for {@link RequestBudget}. */
export interface RequestBudgetOptions {
  /** The most bytes of request bodies one project's calls may hold at once. */
  perProjectBytes: (project: string) => number;
  /** The most all projects' calls together may hold; unbounded without. */
  totalBytes?: number;
  /** What the operator changes to raise a project's budget, for the refusal's message. */
  raiseWith: string;
}

/** A burst that held this much is followed by a garbage collection once nothing is held any more. */
const COLLECT_AFTER_BYTES = 16 * MIB;

/**
 * Bytes of request bodies a server holds for calls that have not ended, per project. A call
 * takes its body's size from the length prefix before a byte of the body is read, and gives it
 * back when its handler is done (see callGuard), so however many calls a project makes at once,
 * the bodies a server holds for it stay within its budget, and one project's flood never uses
 * another's.
 */
export class RequestBudget {
  private readonly held = new Map<string, number>();
  private total = 0;
  private peak = 0;

  constructor(private readonly options: RequestBudgetOptions) {}

  /** Bytes `project`'s calls hold now. */
  heldBy(project: string): number {
    return this.held.get(project) ?? 0;
  }

  /**
   * Takes `bytes` for a call of `project`; the returned function gives them back (once, however
   * often it is called). Refuses with a retryable `resource_exhausted` when the project's budget,
   * or the server's, has no room: the caller sent nothing the server read, so it may try again.
   */
  take(project: string, bytes: number): () => void {
    const mine = this.heldBy(project);
    const limit = this.options.perProjectBytes(project);
    if (mine + bytes > limit) {
      throw new SandgymError(
        'resource_exhausted',
        `Project ${project} has ${mib(mine)} of request bodies in flight here and its budget is ${mib(limit)}, so this ${mib(bytes)} request was refused unread: retry when its other calls end (sandgym clients do), send fewer large requests at once, or raise ${this.options.raiseWith}`,
        { retryable: true },
      );
    }
    const all = this.options.totalBytes;
    if (all !== undefined && this.total + bytes > all) {
      throw new SandgymError(
        'resource_exhausted',
        `This server holds ${mib(this.total)} of request bodies in flight for all projects, its limit is ${mib(all)}, so this ${mib(bytes)} request of project ${project} was refused unread: retry when calls end (sandgym clients do)`,
        { retryable: true },
      );
    }
    this.held.set(project, mine + bytes);
    this.total += bytes;
    this.peak = Math.max(this.peak, this.total);
    let given = false;
    return () => {
      if (given) return;
      given = true;
      const left = this.heldBy(project) - bytes;
      if (left > 0) this.held.set(project, left);
      else this.held.delete(project);
      this.total -= bytes;
      // the bodies are garbage now, in old space: give their memory back while the server idles
      if (this.total === 0) {
        if (this.peak >= COLLECT_AFTER_BYTES) collectGarbageSoon();
        this.peak = 0;
      }
    };
  }
}

function mib(bytes: number): string {
  return `${(bytes / MIB).toFixed(bytes % MIB === 0 ? 0 : 1)} MiB`;
}
