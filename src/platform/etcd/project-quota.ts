import { randomUUID } from 'node:crypto';
import type { Etcd3 } from 'etcd3';
import { z } from 'zod';
import { SandgymError } from '../../common/index.ts';
import { ETCD_PREFIX } from './etcd-connection.ts';
import type { NodeMembership } from './node-membership.ts';

const QUOTA_PREFIX = `${ETCD_PREFIX}quota/`;
/**
 * A node short of slots while others hold blocks says so here, one key per project and node on
 * its lease; outside `quota/` so no project's name can reach it.
 */
const WANTED_PREFIX = `${ETCD_PREFIX}quota-wanted/`;
/** Each grow retries when another node's grow for the same project committed between read and write. */
const MAX_ATTEMPTS = 64;
/** Most slots a node takes beyond what it needs now, for the creates that follow. */
const MAX_SPARE = 64;
/**
 * A grow takes as spare at least 1/8 of what is free beyond its need, and up to half of it when
 * its recent creates ask for more, so near the quota blocks are nearly exact.
 */
const SPARE_SHARE = 8;
/**
 * How often a node holding spare looks at who wants slots: at each look it returns a block's
 * spare when another node wants slots of the project, and when no claim took a slot of the block
 * for {@link IDLE_LOOKS} looks running.
 */
const RETURN_EVERY_MS = 250;
/** 2 s: long enough that a block used now and then through a burst is not returned and grown again. */
const IDLE_LOOKS = 8;
/**
 * A node short of slots while others hold blocks waits at most this long, in all, for them to
 * return spare: their next look, a read and a write, with room for a loaded etcd (0.55 s
 * refused creates within the quota on a busy 2-core host)...
 */
const WAIT_FOR_RETURN_MS = 1000;
/** ...reading the blocks again this often. */
const WAIT_POLL_MS = 50;
/**
 * After a conflict a grow waits at random up to this long, doubled per conflict in a row (up to
 * 16 times), so nodes racing for one guard spread out instead of each proposing again at once.
 */
const CONFLICT_BACKOFF_MS = 5;

const heldPrefix = (project: string): string => `${QUOTA_PREFIX}${project}/held/`;
const blocksPrefix = (project: string): string => `${QUOTA_PREFIX}${project}/blocks/`;
const guardKey = (project: string): string => `${QUOTA_PREFIX}${project}/guard`;
const wantedPrefix = (project: string): string => `${WANTED_PREFIX}${project}/`;

/** A block key's value: the slots it holds, and how many of them were spare when it was written. */
const blockValue = z.object({ size: z.number().int().nonnegative(), spare: z.number().int().nonnegative() });
type BlockValue = z.infer<typeof blockValue>;

/** Counts and milliseconds of a ledger's work, summed since it began. */
export interface QuotaProfile {
  claims: number;
  /** From a claim's call to its slot taken, waits included. */
  claimMs: number;
  /** Of that, waiting behind the block's earlier changes (another claim's grow, a return). */
  queuedMs: number;
  /** Grow transactions committed, and the time from a grow's first read to its commit. */
  grows: number;
  growMs: number;
  /** Grow transactions that found the guard moved and read again. */
  conflicts: number;
  /** Waits for other nodes to return spare, when the quota seemed full. */
  waitsForSpare: number;
  /** Block writes that are not grows: spare returned, adopted sandboxes counted. */
  returnWrites: number;
  holdWrites: number;
}

const newQuotaProfile = (): QuotaProfile => ({
  claims: 0,
  claimMs: 0,
  queuedMs: 0,
  grows: 0,
  growMs: 0,
  conflicts: 0,
  waitsForSpare: 0,
  returnWrites: 0,
  holdWrites: 0,
});

/** This node's share of one project's quota. */
interface Block {
  /** Slots held in etcd (the block key's size); zero when there is none. */
  size: number;
  /** The lease the block key was written on: a block under a lost lease went with it. */
  lease: string | undefined;
  /** Slots in use: claims not yet settled or released, and the project's sandboxes here. */
  used: number;
  /** Slots that claims waiting for this block's queue ask for, so one grow can serve them all. */
  waiting: number;
  /** Slots claims took since the last look for spare to return: the block's recent rate. */
  taken: number;
  /** Looks in a row that found no slot taken. */
  idleLooks: number;
  /** This node's changes to the block, one at a time. */
  queue: Promise<unknown>;
  /** A queued write of the block for sandboxes counted by {@link ProjectQuotaLedger.hold}. */
  flush: Promise<void> | undefined;
}

/** What a grow reads, in one transaction: the guard's revision, every block, who wants slots. */
interface GrowInputs {
  guardRevision: string;
  others: BlockValue[];
  /** Another node waits for slots of the project: take none beyond the need. */
  wanted: boolean;
}

/**
 * A project's quota across the cluster, as blocks of it that nodes hold in etcd: each node holds
 * a key per project whose size is the slots it may fill, on its lease. A create takes a slot of
 * its node's block in memory, with no etcd write; only when the block is full does the node grow
 * it, in a transaction that bumps the project's guard key and commits only if the guard has not
 * moved since the node summed every block, so the blocks never add up to more than the quota
 * however many controllers and nodes admit. A grow takes what the claims waiting on the block
 * need plus a spare: an eighth of what is free beyond that, or as many as the block's claims
 * took since the last look for spare if more (up to half of what is free, at most
 * {@link MAX_SPARE}); none while another node wants slots of the project. A sandbox's end frees
 * its slot into its block's spare, again with no etcd write. A node short of slots while others
 * hold blocks writes a key under `quota-wanted/` and waits up to {@link WAIT_FOR_RETURN_MS} for
 * room; every {@link RETURN_EVERY_MS} a node holding spare reads those keys (one read for all
 * projects) and returns the spare wanted, and the spare of blocks idle for {@link IDLE_LOOKS}
 * looks. A grow's inputs are one read, and a grow that lost the race backs off at random before
 * reading again. A dead node's blocks go with its lease. Each live sandbox is also a
 * key under `held/` on one of its node's leases (see NodeMembership.holdAll), for counting.
 */
export class ProjectQuotaLedger {
  /** Where this ledger's claims spent etcd's work and their time, for the benchmark to report. */
  readonly profile = newQuotaProfile();
  private readonly blocks = new Map<string, Block>();
  private readonly claims = new Set<string>();
  private returning: NodeJS.Timeout | undefined;

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
    const called = performance.now();
    const block = this.blockOf(project);
    block.waiting += count;
    try {
      await this.serially(block, async () => {
        this.profile.queuedMs += performance.now() - called;
        block.waiting -= count;
        await this.take(project, block, count, max);
      });
      this.profile.claims++;
      this.profile.claimMs += performance.now() - called;
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
    block.taken += count;
    this.returnSpareSoon();
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
    const begun = performance.now();
    let inputs = await this.readGrowInputs(project);
    // set when the quota first seems full: until then, and again after a conflict, it waits
    let waitUntil: number | undefined;
    try {
      for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        let taken = sizes(inputs.others);
        const need = block.used + count - block.size;
        if (need > max - taken - block.size && inputs.others.length > 0) {
          if (waitUntil === undefined) {
            // other nodes may sit on spare: ask for it
            waitUntil = performance.now() + WAIT_FOR_RETURN_MS;
            this.profile.waitsForSpare++;
            await this.etcd.put(this.wantedKey(project)).value('').lease(lease).exec();
          }
          // read until they return it or time is up
          while (need > max - taken - block.size && performance.now() < waitUntil) {
            await sleep(WAIT_POLL_MS);
            inputs = await this.readGrowInputs(project);
            taken = sizes(inputs.others);
          }
        }
        const free = max - taken - block.size;
        if (need > free) {
          throw new SandgymError(
            'resource_exhausted',
            `Project ${project} has ${Math.min(max, taken + block.used)} of its ${max} sandboxes${count > 1 ? ` and asks for ${count} more` : ''}; destroy some or raise its quota`,
            { retryable: true },
          );
        }
        const spare = inputs.wanted ? 0 : this.spareFor(block, free - need);
        const size = block.size + need + spare;
        const committed = await this.etcd
          .if(guardKey(project), 'Mod', '==', inputs.guardRevision)
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
          this.profile.grows++;
          this.profile.growMs += performance.now() - begun;
          return;
        }
        this.profile.conflicts++;
        await sleep(Math.random() * CONFLICT_BACKOFF_MS * 2 ** Math.min(attempt, 4));
        inputs = await this.readGrowInputs(project);
      }
    } finally {
      if (waitUntil !== undefined)
        await this.etcd
          .delete()
          .key(this.wantedKey(project))
          .exec()
          .catch(() => undefined);
    }
    throw new SandgymError(
      'resource_exhausted',
      `Project ${project}'s quota is contended by too many concurrent creates; retry`,
      { retryable: true },
    );
  }

  /**
   * The spare a grow takes beyond its need, of `rest` free slots: an eighth of them, or what the
   * block's queue and recent claims ask for when more, but never more than half nor
   * {@link MAX_SPARE}.
   */
  private spareFor(block: Block, rest: number): number {
    const asked = Math.min(block.waiting + block.taken, Math.floor(rest / 2));
    return Math.min(MAX_SPARE, Math.max(Math.floor(rest / SPARE_SHARE), asked));
  }

  /** The guard, the project's blocks and its wanted keys, read in one transaction. */
  private async readGrowInputs(project: string): Promise<GrowInputs> {
    const read = await this.etcd
      .if(guardKey(project), 'Create', '>', -1)
      .then(
        this.etcd.get(guardKey(project)),
        this.etcd.getAll().prefix(blocksPrefix(project)),
        this.etcd.getAll().prefix(wantedPrefix(project)),
      )
      .commit();
    const [guard, blocks, wanted] = read.responses.map((response) => response.response_range?.kvs ?? []);
    const own = this.blockKey(project);
    return {
      guardRevision: guard?.[0]?.mod_revision ?? '0',
      others: (blocks ?? [])
        .filter((kv) => kv.key.toString() !== own)
        .map((kv) => parseBlock(kv.value.toString())),
      wanted: (wanted ?? []).some((kv) => kv.key.toString() !== this.wantedKey(project)),
    };
  }

  /**
   * Every {@link RETURN_EVERY_MS} while any block holds spare: reads who wants slots (one read for
   * all projects), then shrinks to what is in use each block that another node wants slots of,
   * or that no claim took a slot of since the last look. Lowering a block needs no guard.
   */
  private returnSpareSoon(): void {
    if (this.returning) return;
    this.returning = setTimeout(() => {
      void this.returnSpare()
        .catch(() => undefined)
        .finally(() => {
          this.returning = undefined;
          if ([...this.blocks.values()].some((block) => block.size > block.used)) this.returnSpareSoon();
        });
    }, RETURN_EVERY_MS);
    this.returning.unref();
  }

  private async returnSpare(): Promise<void> {
    const wanted = new Set<string>();
    const keys = await this.etcd.getAll().prefix(WANTED_PREFIX).keys();
    for (const key of keys) {
      const [project, node] = key.slice(WANTED_PREFIX.length).split('/');
      if (project !== undefined && node !== this.nodeId) wanted.add(project);
    }
    await Promise.all(
      [...this.blocks].map(async ([project, block]) => {
        block.idleLooks = block.taken === 0 ? block.idleLooks + 1 : 0;
        block.taken = 0;
        if (block.size <= block.used || !(block.idleLooks >= IDLE_LOOKS || wanted.has(project))) return;
        await this.serially(block, async () => {
          if (block.size <= block.used || block.lease === undefined) return;
          const lease = await this.membership.currentLease().catch(() => undefined);
          if (lease !== block.lease) return;
          block.size = block.used;
          this.profile.returnWrites++;
          await this.writeBlock(project, block, lease);
        });
      }),
    );
  }

  private blockOf(project: string): Block {
    let block = this.blocks.get(project);
    if (!block) {
      block = {
        size: 0,
        lease: undefined,
        used: 0,
        waiting: 0,
        taken: 0,
        idleLooks: 0,
        queue: Promise.resolve(),
        flush: undefined,
      };
      this.blocks.set(project, block);
    }
    return block;
  }

  /** Runs `change` on a block after every change before it. */
  private serially<T>(block: Block, change: () => Promise<T>): Promise<T> {
    const result = block.queue.then(change);
    block.queue = result.catch(() => undefined);
    return result;
  }

  private blockKey(project: string): string {
    return blocksPrefix(project) + this.nodeId;
  }

  private wantedKey(project: string): string {
    return wantedPrefix(project) + this.nodeId;
  }

  /** Turns a claim into the sandbox it made: the sandbox's key, for counting; its slot stays taken. */
  async settle(project: string, claim: string, sandboxId: string): Promise<void> {
    if (!this.claims.delete(claim)) return this.hold(project, sandboxId);
    await this.membership.hold(heldPrefix(project) + sandboxId, sandboxId);
  }

  /**
   * Counts sandboxes that exist without a claim (adopted after a restart, made with a node
   * token): they take slots whether or not the quota has room, as they run already. Holds that
   * arrive together share one write of the block, and their keys go in transactions of many.
   */
  async hold(project: string, ...sandboxIds: string[]): Promise<void> {
    const block = this.blockOf(project);
    block.used += sandboxIds.length;
    block.flush ??= this.serially(block, async () => {
      block.flush = undefined;
      const lease = await this.membership.currentLease();
      // a block on a lost lease went with it: what this node runs needs its slots again
      if (block.lease !== lease) Object.assign(block, { size: 0, lease });
      if (block.used <= block.size) return;
      block.size = block.used;
      this.profile.holdWrites++;
      await this.writeBlock(project, block, lease);
    });
    await block.flush;
    await this.membership.holdAll(sandboxIds.map((id) => [heldPrefix(project) + id, id]));
  }

  /**
   * Frees a claim that made nothing, or a sandbox that is gone. Its slot becomes spare of the
   * node's block, for the node's next create at no etcd cost; the block returns it when another
   * node wants it or no claim takes it (see {@link returnSpareSoon}).
   */
  async release(project: string, sandboxIdOrClaim: string): Promise<void> {
    const wasClaim = this.claims.delete(sandboxIdOrClaim);
    const block = this.blocks.get(project);
    if (block && block.used > 0) {
      block.used--;
      this.returnSpareSoon();
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

const sizes = (blocks: BlockValue[]): number => blocks.reduce((sum, block) => sum + block.size, 0);

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

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
