import { randomUUID } from 'node:crypto';
import type { Etcd3 } from 'etcd3';
import { z } from 'zod';
import { SandgymError } from '../../common/index.ts';
import { ETCD_PREFIX } from './etcd-connection.ts';
import type { NodeMembership } from './node-membership.ts';

const QUOTA_PREFIX = `${ETCD_PREFIX}quota/`;
/** Each grow retries when another node's grow for the same project committed between read and write. */
const MAX_ATTEMPTS = 64;
/** Most slots a node takes beyond what it needs now, for the creates that follow. */
const MAX_SPARE = 64;
/** A grow takes as spare at most this fraction of what is free (1/8), so near the quota blocks are exact. */
const SPARE_SHARE = 8;
/** A node returns the spare of a block this long after it began using or freeing it. */
const RETURN_AFTER_MS = 500;
/** A node short of slots while others hold spare waits this long, once, for them to return it. */
const WAIT_FOR_RETURN_MS = RETURN_AFTER_MS + 300;

const heldPrefix = (project: string): string => `${QUOTA_PREFIX}${project}/held/`;
const blocksPrefix = (project: string): string => `${QUOTA_PREFIX}${project}/blocks/`;
const guardKey = (project: string): string => `${QUOTA_PREFIX}${project}/guard`;

/** A block key's value: the slots it holds, and how many of them were spare when it was written. */
const blockValue = z.object({ size: z.number().int().nonnegative(), spare: z.number().int().nonnegative() });
type BlockValue = z.infer<typeof blockValue>;

/** This node's share of one project's quota. */
interface Block {
  /** Slots held in etcd (the block key's size); zero when there is none. */
  size: number;
  /** The lease the block key was written on: a block under a lease since lost went with it. */
  lease: string | undefined;
  /** Slots in use: claims not yet settled or released, and the project's sandboxes here. */
  used: number;
  /** This node's changes to the block, one at a time. */
  queue: Promise<unknown>;
  returning: NodeJS.Timeout | undefined;
}

/**
 * A project's quota across the cluster, as blocks of it that nodes hold in etcd: each node holds
 * a key per project whose size is the slots it may fill, on its lease. A create takes a slot of
 * its node's block in memory; only when the block is full does the node grow it, in a
 * transaction that bumps the project's guard key and commits only if the guard has not moved
 * since the node summed every block, so the blocks never add up to more than the quota however
 * many controllers and nodes admit. A grow takes what the create needs plus a spare of up to
 * 1/{@link SPARE_SHARE} of what is free (at most {@link MAX_SPARE}): far from the quota a node
 * touches the guard once per many creates, near it once per create, as exactly as before. A
 * block returns its spare within {@link RETURN_AFTER_MS}, busy or not, and a node short of slots
 * while others hold spare waits for that once before refusing. A dead node's blocks go with its
 * lease. Each live sandbox is also a key under `held/` on its node's lease, for counting.
 */
export class ProjectQuotaLedger {
  /** Grow transactions that found the guard moved and read again (the benchmark reports them). */
  conflicts = 0;
  private readonly blocks = new Map<string, Block>();
  private readonly claims = new Set<string>();

  constructor(
    private readonly etcd: Etcd3,
    private readonly membership: NodeMembership,
    private readonly nodeId: string,
  ) {}

  /**
   * Claims `count` places for a project that may have `max` sandboxes; returns the claims, to
   * be {@link settle}d into the sandboxes made or {@link release}d if none are.
   */
  async claim(project: string, count: number, max: number): Promise<string[]> {
    try {
      await this.serially(project, (block) => this.take(project, block, count, max));
    } catch (error) {
      if (error instanceof SandgymError) throw error;
      // etcd did not answer: another node (or this one, later) may do better
      throw new SandgymError(
        'admission_rejected',
        `The node could not reach etcd to claim project ${project}'s quota: ${error instanceof Error ? error.message : String(error)}`,
        { retryable: true, cause: error },
      );
    }
    const claims = Array.from({ length: count }, () => `claim-${randomUUID()}`);
    for (const claim of claims) this.claims.add(claim);
    return claims;
  }

  private async take(project: string, block: Block, count: number, max: number): Promise<void> {
    const lease = await this.membership.currentLease();
    // a block written on a lost lease went with it: this node's sandboxes need slots again
    if (block.lease !== lease) Object.assign(block, { size: 0, lease });
    if (block.used + count > block.size) await this.grow(project, block, count, max, lease);
    block.used += count;
    this.returnSpareLater(project, block);
  }

  /** Grows this node's block to hold `count` more, or refuses when the quota has no room. */
  private async grow(
    project: string,
    block: Block,
    count: number,
    max: number,
    lease: string,
  ): Promise<void> {
    const own = this.blockKey(project);
    let waited = false;
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      // the guard first, then the blocks: a grow that lands after the guard read moves the guard
      // and fails our commit; one that landed before it is in the sum
      const guard = await this.etcd.get(guardKey(project)).exec();
      const guardRevision = guard.kvs[0]?.mod_revision ?? '0';
      const others = (await this.etcd.getAll().prefix(blocksPrefix(project)).exec()).kvs
        .filter((kv) => kv.key.toString() !== own)
        .map((kv) => parseBlock(kv.value.toString()));
      const taken = others.reduce((sum, other) => sum + other.size, 0);
      const free = max - taken - block.size;
      const need = block.used + count - block.size;
      if (need > free) {
        if (!waited && others.some((other) => other.spare > 0)) {
          // other nodes may be sitting on spare they are about to return
          waited = true;
          await new Promise((resolve) => setTimeout(resolve, WAIT_FOR_RETURN_MS));
          continue;
        }
        throw new SandgymError(
          'resource_exhausted',
          `Project ${project} has ${Math.min(max, taken + block.used)} of its ${max} sandboxes${count > 1 ? ` and asks for ${count} more` : ''}; destroy some or raise its quota`,
          { retryable: true },
        );
      }
      const spare = Math.min(MAX_SPARE, Math.floor((free - need) / SPARE_SHARE));
      const size = block.size + need + spare;
      const committed = await this.etcd
        .if(guardKey(project), 'Mod', '==', guardRevision)
        .then(
          this.etcd.put(guardKey(project)).value(String(Date.now())),
          this.etcd
            .put(own)
            .value(JSON.stringify({ size, spare } satisfies BlockValue))
            .lease(lease),
        )
        .commit();
      if (committed.succeeded) {
        block.size = size;
        return;
      }
      this.conflicts++;
    }
    throw new SandgymError(
      'resource_exhausted',
      `Project ${project}'s quota is contended by too many concurrent creates; retry`,
      { retryable: true },
    );
  }

  /**
   * Shrinks the block to what is in use {@link RETURN_AFTER_MS} after the first claim or release
   * since it last did, busy or not, so spare is never stranded longer than that; lowering a block
   * needs no guard.
   */
  private returnSpareLater(project: string, block: Block): void {
    if (block.returning) return;
    block.returning = setTimeout(() => {
      block.returning = undefined;
      void this.serially(project, async () => {
        if (block.size <= block.used || block.lease === undefined) return;
        const lease = await this.membership.currentLease().catch(() => undefined);
        if (lease !== block.lease) return;
        block.size = block.used;
        await this.writeBlock(project, block, lease);
      }).catch(() => undefined);
    }, RETURN_AFTER_MS);
    block.returning.unref();
  }

  /** Runs `change` on the project's block after every change before it. */
  private serially<T>(project: string, change: (block: Block) => Promise<T>): Promise<T> {
    let block = this.blocks.get(project);
    if (!block) {
      block = { size: 0, lease: undefined, used: 0, queue: Promise.resolve(), returning: undefined };
      this.blocks.set(project, block);
    }
    const current = block;
    const result = current.queue.then(() => change(current));
    current.queue = result.catch(() => undefined);
    return result;
  }

  private blockKey(project: string): string {
    return blocksPrefix(project) + this.nodeId;
  }

  /** Turns a claim into the sandbox it made: the sandbox's key, for counting; its slot stays taken. */
  async settle(project: string, claim: string, sandboxId: string): Promise<void> {
    if (!this.claims.delete(claim)) return this.hold(project, sandboxId);
    await this.membership.hold(heldPrefix(project) + sandboxId, sandboxId);
  }

  /**
   * Counts a sandbox that exists without a claim (adopted after a restart, made with a node
   * token): it takes a slot whether or not the quota has room, as it is running already.
   */
  async hold(project: string, sandboxId: string): Promise<void> {
    await this.serially(project, async (block) => {
      const lease = await this.membership.currentLease();
      if (block.lease !== lease) Object.assign(block, { size: 0, lease });
      block.used++;
      if (block.used <= block.size) return;
      block.size = block.used;
      await this.writeBlock(project, block, lease);
    });
    await this.membership.hold(heldPrefix(project) + sandboxId, sandboxId);
  }

  /**
   * Frees a claim that made nothing, or a sandbox that is gone. Its slot goes back to the pool at
   * once (the block shrinks by it), so a node elsewhere can take it.
   */
  async release(project: string, sandboxIdOrClaim: string): Promise<void> {
    const wasClaim = this.claims.delete(sandboxIdOrClaim);
    const block = this.blocks.get(project);
    if (block) {
      await this.serially(project, async () => {
        if (block.used > 0) block.used--;
        const lease = await this.membership.currentLease().catch(() => undefined);
        if (lease === undefined || lease !== block.lease || block.size <= block.used) return;
        // lowered here before etcd is: a failed write leaves etcd counting more, never less
        block.size--;
        await this.writeBlock(project, block, lease);
      }).catch(() => undefined);
    }
    if (!wasClaim) await this.membership.drop(heldPrefix(project) + sandboxIdOrClaim);
  }

  /** Writes this node's block as it is now (deleting it when empty); lowering one needs no guard. */
  private async writeBlock(project: string, block: Block, lease: string): Promise<void> {
    const own = this.blockKey(project);
    await (block.size === 0
      ? this.etcd.delete().key(own).exec()
      : this.etcd
          .put(own)
          .value(JSON.stringify({ size: block.size, spare: block.size - block.used } satisfies BlockValue))
          .lease(lease)
          .exec());
  }

  /** Live sandboxes of a project as etcd counts them. */
  count(project: string): Promise<number> {
    return this.etcd.getAll().prefix(heldPrefix(project)).count();
  }
}

function parseBlock(text: string): BlockValue {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const block = blockValue.safeParse(parsed);
  // a block this version cannot read counts as the whole quota: refusing is safe, admitting is not
  return block.success ? block.data : { size: Number.MAX_SAFE_INTEGER, spare: 0 };
}
