import type { Etcd3, Lease, Watcher } from 'etcd3';
import { z } from 'zod';
import { SandgymError, type Logger } from '../../common/index.ts';
import { BACKEND_NAMES } from '../../backends/index.ts';
import { ETCD_PREFIX } from './etcd-connection.ts';

const NODES_PREFIX = `${ETCD_PREFIX}nodes/`;
/** Most writes etcd takes in one transaction (its `--max-txn-ops` default). */
const MAX_TXN_OPS = 128;
/**
 * Most held keys one lease carries. etcd before its fix for etcd#15993 (3.4.23, say) applies a
 * put on a lease in time linear in the keys already on it, so a node with thousands of
 * sandboxes spreads their keys over leases of this many, all kept alive as its record's is.
 */
const KEYS_PER_LEASE = 1000;

/** A lease held keys go on, and how many are on it (or reserved for a write in flight). */
interface KeyLease {
  lease: Lease;
  id: string;
  keys: number;
}

/** What a node agent publishes about itself while its lease lives. */
const nodeRecordSchema = z.object({
  nodeId: z.string().min(1),
  /** host:port controllers dial. */
  address: z.string().min(1),
  backends: z.array(z.enum(BACKEND_NAMES)),
  /** Most sandboxes it runs at once. */
  capacity: z.number().int().nonnegative(),
  memoryCapacityMib: z.number().int().nonnegative(),
  /** A draining node takes no new sandboxes. */
  draining: z.boolean(),
});
export type NodeRecord = z.infer<typeof nodeRecordSchema>;

/**
 * A node agent's membership: its record under a lease the agent keeps alive. When the agent dies
 * or loses etcd for longer than the lease, etcd deletes the record and every controller stops
 * placing on it. Keys the agent holds for its sandboxes (quota claims) hang off leases of its
 * own, {@link KEYS_PER_LEASE} to a lease, kept alive alongside, so they vanish with the node, and
 * are written again when the agent rejoins with a new lease.
 */
export class NodeMembership {
  private lease: Lease | undefined;
  private leaseId: string | undefined;
  /** Each held key's value and the lease it is on (none while it waits for a rejoin). */
  private readonly held = new Map<string, { value: string; lease: KeyLease | undefined }>();
  private keyLeases: KeyLease[] = [];
  private granting: Promise<void> | undefined;
  private closed = false;

  private constructor(
    private readonly etcd: Etcd3,
    private record: NodeRecord,
    private readonly ttlSeconds: number,
    private readonly logger: Logger,
  ) {}

  static async join(
    etcd: Etcd3,
    record: NodeRecord,
    ttlSeconds: number,
    logger: Logger,
  ): Promise<NodeMembership> {
    const membership = new NodeMembership(etcd, record, ttlSeconds, logger);
    await membership.grant();
    return membership;
  }

  /**
   * The lease keys of this node hang off, for transactions that write them. Between losing a
   * lease and rejoining there is none, and callers fail at once rather than wait for etcd.
   */
  currentLease(): Promise<string> {
    if (this.leaseId) return Promise.resolve(this.leaseId);
    return Promise.reject(
      new SandgymError('admission_rejected', 'This node has lost etcd and is rejoining; place elsewhere', {
        retryable: true,
      }),
    );
  }

  /** Writes a key that lives as long as this node's membership, and again after a rejoin. */
  hold(key: string, value: string): Promise<void> {
    return this.holdAll([[key, value]]);
  }

  /** Writes keys as {@link hold} does, {@link MAX_TXN_OPS} to a transaction. */
  async holdAll(entries: [key: string, value: string][]): Promise<void> {
    for (const [key, value] of entries) {
      this.forget(key);
      this.held.set(key, { value, lease: undefined });
    }
    // while rejoining there is no lease: the rejoin writes them
    await this.currentLease();
    for (let first = 0; first < entries.length; first += MAX_TXN_OPS)
      await this.writeHeld(entries.slice(first, first + MAX_TXN_OPS));
  }

  async drop(key: string): Promise<void> {
    this.forget(key);
    await this.etcd.delete().key(key).exec();
  }

  private forget(key: string): void {
    const entry = this.held.get(key);
    if (entry?.lease) entry.lease.keys--;
    this.held.delete(key);
  }

  /** Writes held keys on a lease with room for them, in one transaction. */
  private async writeHeld(entries: [key: string, value: string][]): Promise<void> {
    const lease = await this.keyLease(entries.length);
    for (const [key] of entries) {
      const entry = this.held.get(key);
      if (entry) entry.lease = lease;
    }
    await this.etcd
      // a condition always true: etcd writes many keys at once only in a transaction
      .if(NODES_PREFIX + this.record.nodeId, 'Create', '>', -1)
      .then(...entries.map(([key, value]) => this.etcd.put(key).value(value).lease(lease.id)))
      .commit();
  }

  /** A lease with room for `count` more keys, taken for them; granted when none has room. */
  private async keyLease(count: number): Promise<KeyLease> {
    for (;;) {
      const open = this.keyLeases.find((lease) => lease.keys + count <= KEYS_PER_LEASE);
      if (open) {
        open.keys += count;
        return open;
      }
      this.granting ??= this.grantKeyLease().finally(() => (this.granting = undefined));
      await this.granting;
    }
  }

  private async grantKeyLease(): Promise<void> {
    const lease = this.etcd.lease(this.ttlSeconds, { autoKeepAlive: true });
    const keyLease: KeyLease = { lease, id: await lease.grant(), keys: 0 };
    lease.on('lost', (error) => {
      if (this.closed || !this.keyLeases.includes(keyLease)) return;
      this.keyLeases = this.keyLeases.filter((other) => other !== keyLease);
      // rejoining: the rejoin writes every key again
      if (!this.leaseId) return;
      this.logger.warn({ err: error }, 'etcd lease of held keys lost: writing them again');
      const orphans = [...this.held]
        .filter(([, entry]) => entry.lease === keyLease)
        .map(([key, entry]): [string, string] => [key, entry.value]);
      void this.holdAll(orphans).catch((err: unknown) => this.logger.debug({ err }, 'held keys not written'));
    });
    this.keyLeases.push(keyLease);
  }

  /** Publishes a change to the record (draining, say). */
  async update(change: Partial<NodeRecord>): Promise<void> {
    this.record = { ...this.record, ...change };
    await this.etcd
      .put(NODES_PREFIX + this.record.nodeId)
      .value(JSON.stringify(this.record))
      .lease(await this.currentLease())
      .exec();
  }

  private async grant(): Promise<void> {
    const lease = this.etcd.lease(this.ttlSeconds, { autoKeepAlive: true });
    lease.on('lost', (error) => {
      if (this.closed || lease !== this.lease) return;
      this.logger.warn({ err: error }, 'etcd lease lost: placement skips this node until it rejoins');
      this.lease = undefined;
      this.leaseId = undefined;
      void this.rejoin();
    });
    this.leaseId = await lease.grant();
    this.lease = lease;
    await this.etcd
      .put(NODES_PREFIX + this.record.nodeId)
      .value(JSON.stringify(this.record))
      .lease(this.leaseId)
      .exec();
    // every held key again, on fresh leases; then the old ones go, with nothing left on them
    const stale = this.keyLeases;
    this.keyLeases = [];
    const entries = [...this.held].map(([key, entry]): [string, string] => {
      entry.lease = undefined;
      return [key, entry.value];
    });
    for (let first = 0; first < entries.length; first += MAX_TXN_OPS)
      await this.writeHeld(entries.slice(first, first + MAX_TXN_OPS));
    await Promise.all(stale.map((old) => old.lease.revoke().catch(() => undefined)));
  }

  /** Tries to join again, backing off, until it has or the membership is closed. */
  private async rejoin(): Promise<void> {
    for (let delayMs = 200; !this.closed; delayMs = Math.min(delayMs * 2, 5_000)) {
      try {
        await this.grant();
        this.logger.info({ node: this.record.nodeId }, 'rejoined etcd');
        return;
      } catch (error) {
        this.logger.debug({ err: error }, 'etcd rejoin failed; retrying');
        await new Promise((resolve) => setTimeout(resolve, delayMs));
      }
    }
  }

  /** Leaves at once: the record and held keys go now, not when the lease would have lapsed. */
  async leave(): Promise<void> {
    this.closed = true;
    const leases = [...(this.lease ? [this.lease] : []), ...this.keyLeases.map((keyLease) => keyLease.lease)];
    this.lease = undefined;
    this.keyLeases = [];
    await Promise.all(
      leases.map((lease) =>
        lease.revoke().catch((error: unknown) => this.logger.debug({ err: error }, 'lease revoke failed')),
      ),
    );
  }
}

/** What a controller hears about membership. */
export interface MembershipListener {
  joined(record: NodeRecord): void;
  left(nodeId: string): void;
}

/**
 * Follows node records: the current set first, then every change from the revision it read, so
 * no join or departure between the two is missed. Records that fail validation are skipped and
 * logged, never trusted.
 */
export async function watchMembership(
  etcd: Etcd3,
  listener: MembershipListener,
  logger: Logger,
): Promise<{ close(): Promise<void> }> {
  const parse = (value: Buffer | string, key: string): NodeRecord | undefined => {
    try {
      return nodeRecordSchema.parse(JSON.parse(value.toString()));
    } catch (error) {
      logger.warn({ key, err: error }, 'ignoring a malformed node record in etcd');
      return undefined;
    }
  };
  const current = await etcd.getAll().prefix(NODES_PREFIX).exec();
  for (const kv of current.kvs) {
    const record = parse(kv.value, kv.key.toString());
    if (record) listener.joined(record);
  }
  const watcher: Watcher = await etcd
    .watch()
    .prefix(NODES_PREFIX)
    .startRevision(String(BigInt(current.header.revision) + 1n))
    .create();
  watcher.on('put', (kv) => {
    const record = parse(kv.value, kv.key.toString());
    if (record) listener.joined(record);
  });
  watcher.on('delete', (kv) => listener.left(kv.key.toString().slice(NODES_PREFIX.length)));
  return { close: () => watcher.cancel() };
}
