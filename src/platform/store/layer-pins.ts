import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { ProcessIdentity } from '../../backends/index.ts';
import { PIN_STALE_MS, type LayerStore, type PinRecord } from './layer-store.ts';

/** How long a layer this process made or is about to mount stays pinned without a sandbox on it. */
const DEFAULT_FRESH_HOLD_MS = 10 * 60_000;
/** How often the record is rewritten whatever changed, so other nodes see this one is alive. */
export const PIN_REFRESH_MS = Math.floor(PIN_STALE_MS / 5);

/**
 * The layers this process needs kept, published in the store (see LayerStore.writePins) for the
 * layer gc of every process and node that shares it: the layers of its live sandboxes, and for a
 * while those it just made or is about to mount, which nothing references yet (a grader's diff
 * between packing and booting, a Dockerfile build's steps before its environment is recorded, a
 * create between reading an environment and mounting its layers). A layer joins the record before
 * the work that needs it goes on.
 */
export class LayerPins {
  private readonly fresh = new Map<string, number>();
  private live: readonly string[] = [];
  private published = new Set<string>();
  private readonly name: string;

  constructor(
    private readonly store: LayerStore,
    private readonly identity: ProcessIdentity,
    /** The layers of this process's live sandboxes, which a refresh reads anew. */
    private readonly liveLayers: () => Promise<string[]>,
    /** How long {@link hold} keeps a layer pinned. */
    private readonly holdMs = DEFAULT_FRESH_HOLD_MS,
  ) {
    // one record per platform: a process may run several, each with its own sandboxes
    this.name = `${hostname()}-${identity.pid}-${identity.startTime}-${randomBytes(4).toString('hex')}`;
  }

  /** Pins layers for a while and publishes them unless they are already. */
  async hold(digests: readonly string[]): Promise<void> {
    const until = Date.now() + this.holdMs;
    for (const digest of digests) this.fresh.set(digest, until);
    if (digests.some((digest) => !this.published.has(digest))) await this.publish();
  }

  /** Reads the live sandboxes' layers again, drops expired pins and publishes the record. */
  async refresh(): Promise<void> {
    this.live = await this.liveLayers();
    await this.publish();
  }

  /** What this process needs kept now. */
  current(): Set<string> {
    const now = Date.now();
    for (const [digest, until] of this.fresh) if (until <= now) this.fresh.delete(digest);
    return new Set([...this.live, ...this.fresh.keys()]);
  }

  private async publish(): Promise<void> {
    const digests = this.current();
    const record: PinRecord = {
      host: hostname(),
      pid: this.identity.pid,
      startTime: this.identity.startTime,
      updatedAt: Date.now(),
      digests: [...digests].sort(),
    };
    await this.store.writePins(this.name, record);
    this.published = digests;
  }

  /** Withdraws the record: this process needs nothing kept any more. */
  async close(): Promise<void> {
    await this.store.removePins(this.name);
  }
}

/** Whether a pin record still counts: a record of this host counts while its process runs. */
export function pinIsLive(isAlive: (identity: ProcessIdentity) => Promise<boolean>) {
  return (record: PinRecord): Promise<boolean> =>
    record.host === hostname()
      ? isAlive({ pid: record.pid, startTime: record.startTime })
      : Promise.resolve(true);
}
