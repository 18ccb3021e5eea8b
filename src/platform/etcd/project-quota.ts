import { randomUUID } from 'node:crypto';
import type { Etcd3 } from 'etcd3';
import { SandgymError } from '../../common/index.ts';
import { ETCD_PREFIX } from './etcd-connection.ts';
import type { NodeMembership } from './node-membership.ts';

const QUOTA_PREFIX = `${ETCD_PREFIX}quota/`;
/** Each claim retries when another claim for the same project committed between read and write. */
const MAX_ATTEMPTS = 64;

const heldPrefix = (project: string): string => `${QUOTA_PREFIX}${project}/held/`;
const guardKey = (project: string): string => `${QUOTA_PREFIX}${project}/guard`;

/**
 * A project's live sandboxes across the cluster, as keys in etcd: one per sandbox, written on the
 * lease of the node that runs it. A create claims its key in a transaction that also bumps the
 * project's guard key, and commits only if the guard has not moved since the count was read, so
 * claims for one project are serialised however many controllers and nodes make them, and the
 * count never passes the quota. Freeing needs no guard: a delete only lowers the count.
 */
export class ProjectQuotaLedger {
  /**
   * Claim transactions that found the guard moved and read again: how contended the project's
   * guard key is (the cluster-scale benchmark reports them per create).
   */
  conflicts = 0;

  constructor(
    private readonly etcd: Etcd3,
    private readonly membership: NodeMembership,
  ) {}

  /**
   * Claims `count` places for a project that may have `max` sandboxes; returns the claim keys, to
   * be {@link settle}d into the sandboxes made or {@link release}d if none are.
   */
  async claim(project: string, count: number, max: number): Promise<string[]> {
    try {
      return await this.tryClaim(project, count, max);
    } catch (error) {
      if (error instanceof SandgymError) throw error;
      // etcd did not answer: another node (or this one, later) may do better
      throw new SandgymError(
        'admission_rejected',
        `The node could not reach etcd to claim project ${project}'s quota: ${error instanceof Error ? error.message : String(error)}`,
        { retryable: true, cause: error },
      );
    }
  }

  private async tryClaim(project: string, count: number, max: number): Promise<string[]> {
    const keys = Array.from({ length: count }, () => `${heldPrefix(project)}claim-${randomUUID()}`);
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      // the guard first, then the count: a claim that lands after the guard read moves the guard
      // and fails our commit; one that landed before it is in the count
      const guard = await this.etcd.get(guardKey(project)).exec();
      const guardRevision = guard.kvs[0]?.mod_revision ?? '0';
      const live = await this.etcd.getAll().prefix(heldPrefix(project)).count();
      if (live + count > max) {
        throw new SandgymError(
          'resource_exhausted',
          `Project ${project} has ${live} of its ${max} sandboxes${count > 1 ? ` and asks for ${count} more` : ''}; destroy some or raise its quota`,
          { retryable: true },
        );
      }
      const lease = await this.membership.currentLease();
      const committed = await this.etcd
        .if(guardKey(project), 'Mod', '==', guardRevision)
        .then(
          this.etcd.put(guardKey(project)).value(String(Date.now())),
          ...keys.map((key) => this.etcd.put(key).value('claimed').lease(lease)),
        )
        .commit();
      if (committed.succeeded) {
        for (const key of keys) this.membership.noteHeld(key, 'claimed');
        return keys;
      }
      this.conflicts++;
    }
    throw new SandgymError(
      'resource_exhausted',
      `Project ${project}'s quota is contended by too many concurrent creates; retry`,
      { retryable: true },
    );
  }

  /** Turns a claim into the sandbox it made, in one transaction, so the count never dips. */
  async settle(project: string, claim: string, sandboxId: string): Promise<void> {
    const key = heldPrefix(project) + sandboxId;
    const lease = await this.membership.currentLease();
    await this.etcd
      .if(claim, 'Create', '>', 0)
      .then(this.etcd.delete().key(claim), this.etcd.put(key).value(sandboxId).lease(lease))
      .else(this.etcd.put(key).value(sandboxId).lease(lease))
      .commit();
    this.membership.noteHeld(key, sandboxId);
    await this.membership.drop(claim).catch(() => undefined);
  }

  /** Counts a sandbox that exists without a claim (adopted after a restart, made with a node token). */
  async hold(project: string, sandboxId: string): Promise<void> {
    await this.membership.hold(heldPrefix(project) + sandboxId, sandboxId);
  }

  async release(project: string, sandboxIdOrClaim: string): Promise<void> {
    const key = sandboxIdOrClaim.startsWith(QUOTA_PREFIX)
      ? sandboxIdOrClaim
      : heldPrefix(project) + sandboxIdOrClaim;
    await this.membership.drop(key);
  }

  /** Live sandboxes of a project as etcd counts them. */
  count(project: string): Promise<number> {
    return this.etcd.getAll().prefix(heldPrefix(project)).count();
  }
}
