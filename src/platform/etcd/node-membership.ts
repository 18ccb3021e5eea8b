import type { Etcd3, Lease, Watcher } from 'etcd3';
import { z } from 'zod';
import { SandgymError, type Logger } from '../../common/index.ts';
import { BACKEND_NAMES } from '../../backends/index.ts';
import { ETCD_PREFIX } from './etcd-connection.ts';

const NODES_PREFIX = `${ETCD_PREFIX}nodes/`;

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
 * placing on it. Keys the agent holds for its sandboxes (quota claims) hang off the same lease,
 * so they vanish with it, and are written again when the agent rejoins with a new lease.
 */
export class NodeMembership {
  private lease: Lease | undefined;
  private leaseId: string | undefined;
  private readonly held = new Map<string, string>();
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
  async hold(key: string, value: string): Promise<void> {
    this.held.set(key, value);
    await this.etcd
      .put(key)
      .value(value)
      .lease(await this.currentLease())
      .exec();
  }

  /** Notes a key a transaction already wrote on this node's lease, so a rejoin writes it again. */
  noteHeld(key: string, value: string): void {
    this.held.set(key, value);
  }

  async drop(key: string): Promise<void> {
    this.held.delete(key);
    await this.etcd.delete().key(key).exec();
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
    const writes = [
      this.etcd
        .put(NODES_PREFIX + this.record.nodeId)
        .value(JSON.stringify(this.record))
        .lease(this.leaseId),
      ...[...this.held].map(([key, value]) => this.etcd.put(key).value(value).lease(this.leaseId!)),
    ];
    await Promise.all(writes.map((write) => write.exec()));
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
    const lease = this.lease;
    this.lease = undefined;
    await lease?.revoke().catch((error: unknown) => this.logger.debug({ err: error }, 'lease revoke failed'));
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
