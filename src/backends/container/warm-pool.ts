import { messageOf, type Logger } from '../../common/index.ts';
import type { QosClass } from '../contract.ts';
import type { SandboxCgroup, UsageBaseline } from '../host/cgroups.ts';
import type { ScratchSlot } from '../host/scratch-volume.ts';
import type { AgentChannel } from '../internal/agent-channel.ts';

/**
 * How many warm shells a node keeps ready, per CPU class. The CPU class is part of a sandbox's
 * security context (it is fixed on the agent at start), so a shell serves only its own class.
 */
export type WarmPoolPolicy = Partial<Record<QosClass, number>>;

/**
 * A live container with no tenant: namespaces, cgroups and agent running on an empty read-only
 * root. A create gives it the tenant's layer stack; a destroy may scrub it and hand it back.
 */
export interface WarmShell {
  /** The name of its folder, cgroups and runtime state; not a sandbox id. */
  slot: string;
  qos: QosClass;
  channel: AgentChannel;
  cgroup: SandboxCgroup;
  /** Resolves when its launcher exits, that is when the container is gone. */
  exited: Promise<void>;
  /** What is known of it, so that taking it costs no lookups: its agent's host pid, its limits. */
  agentPid?: number;
  limits?: string;
  /**
   * The counters it had run up when it was pooled, read then so that taking it costs no reads: a
   * pooled shell's agent is idle, so they still hold when a tenant takes it.
   */
  pooledBaseline?: UsageBaseline;
  /** Whether its `rw/upper` and `rw/work` are made and empty, ready for its next tenant's overlay. */
  writableDirsReady?: boolean;
  /** Its subvolume on the node's scratch volume, and the disk cap set on it (MiB). */
  scratch: ScratchSlot;
  diskMib: number;
  /**
   * Its agent's process state as the agent reported it at start (see agent/selfstate.c), for the
   * check that no tenant changed it; unknown for an adopted container, which is never pooled.
   */
  agentState?: string;
}

/** What the pool needs from its backend. */
export interface ShellFactory {
  createShell(qos: QosClass): Promise<WarmShell>;
  destroyShell(shell: WarmShell): Promise<void>;
}

/** After this long without a create in flight, the node counts as idle and refills its pool. */
const IDLE_BEFORE_REFILL_MS = 50;
const MAX_REFILL_BACKOFF_MS = 30_000;

/**
 * The node's warm shells. Creates take from it first and fall back to cold creates when it is
 * empty; it refills one shell at a time, only while no create is in flight, so a burst never
 * competes with its own refill.
 */
export class WarmPool {
  private readonly shells = new Map<QosClass, WarmShell[]>();
  private creating = 0;
  private refilling = false;
  private closed = false;
  private timer: NodeJS.Timeout | undefined;
  private backoffMs = 0;
  private readonly exitedShells = new WeakSet<WarmShell>();
  private readonly watched = new WeakSet<WarmShell>();
  private readonly reserved = new Map<QosClass, number>();
  private readonly policy: WarmPoolPolicy;

  constructor(
    policy: WarmPoolPolicy,
    private readonly factory: ShellFactory,
    private readonly logger: Logger,
  ) {
    this.policy = { ...policy };
    this.scheduleRefill();
  }

  /**
   * Raises the pool's targets to at least `policy`'s (never lowers them): a batch about to run
   * sizes the pool to its concurrency, which fills in the background from then on, and from the
   * shells its own finished sandboxes leave.
   */
  grow(policy: WarmPoolPolicy): void {
    let grew = false;
    for (const qos of ['latency', 'best_effort'] as const) {
      const wanted = Math.max(0, Math.floor(policy[qos] ?? 0));
      if (wanted > this.target(qos)) {
        this.policy[qos] = wanted;
        grew = true;
      }
    }
    if (grew) this.scheduleRefill();
  }

  /** Shells ready now, per class. */
  get ready(): Record<QosClass, number> {
    return { latency: this.count('latency'), best_effort: this.count('best_effort') };
  }

  private count(qos: QosClass): number {
    return this.shells.get(qos)?.length ?? 0;
  }

  private target(qos: QosClass): number {
    return Math.max(0, Math.floor(this.policy[qos] ?? 0));
  }

  /**
   * A ready shell of this class, or undefined when there is none: the most recently pooled (whose
   * pages are warmest) of those that `suits`, else of any.
   */
  take(qos: QosClass, suits: (shell: WarmShell) => boolean = () => true): WarmShell | undefined {
    const list = this.shells.get(qos) ?? [];
    // a shell that died while pooled is skipped; its exit handler already reaps it
    const live = (shell: WarmShell): boolean => !this.exitedShells.has(shell);
    let at = list.findLastIndex((shell) => live(shell) && suits(shell));
    if (at < 0) at = list.findLastIndex(live);
    return at < 0 ? undefined : list.splice(at, 1)[0];
  }

  /**
   * Claims a place for a shell about to be scrubbed, when the pool has room for its class: the
   * caller then puts the shell, or gives the place back with {@link unreserve}.
   */
  reserve(qos: QosClass): boolean {
    const reserved = this.reserved.get(qos) ?? 0;
    // a scrub is far cheaper than the cold start that a refill would need later, so scrubbed
    // shells are kept up to twice the target
    if (this.closed || this.count(qos) + reserved >= 2 * this.target(qos)) return false;
    this.reserved.set(qos, reserved + 1);
    return true;
  }

  unreserve(qos: QosClass): void {
    this.reserved.set(qos, Math.max(0, (this.reserved.get(qos) ?? 0) - 1));
  }

  /** Puts a shell (new, or scrubbed after its tenant on a reserved place) in the pool. */
  put(shell: WarmShell, reserved = false): void {
    if (reserved) this.unreserve(shell.qos);
    // a shell readied after the pool closed has no pool to wait in
    if (this.closed) {
      void this.factory.destroyShell(shell).catch(() => undefined);
      return;
    }
    const list = this.shells.get(shell.qos) ?? [];
    this.shells.set(shell.qos, list);
    list.push(shell);
    if (this.watched.has(shell)) return;
    this.watched.add(shell);
    void shell.exited.then(() => this.onExit(shell));
  }

  /** A shell that dies while pooled is reaped and replaced; one that dies serving a tenant is its tenant's business. */
  private onExit(shell: WarmShell): void {
    this.exitedShells.add(shell);
    const list = this.shells.get(shell.qos) ?? [];
    const at = list.indexOf(shell);
    if (at < 0) return;
    list.splice(at, 1);
    this.logger.warn({ slot: shell.slot }, 'a pooled shell exited; replacing it');
    void this.factory.destroyShell(shell).catch(() => undefined);
    this.scheduleRefill();
  }

  /** Brackets a create, so that refills wait for the node to be idle. */
  async whileCreating<T>(create: () => Promise<T>): Promise<T> {
    this.creating++;
    try {
      return await create();
    } finally {
      this.creating--;
      this.scheduleRefill();
    }
  }

  private scheduleRefill(delayMs = IDLE_BEFORE_REFILL_MS): void {
    if (this.closed || this.refilling) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.refill(), delayMs);
    this.timer.unref();
  }

  private async refill(): Promise<void> {
    if (this.closed || this.refilling) return;
    this.refilling = true;
    try {
      for (const qos of ['latency', 'best_effort'] as const) {
        while (
          !this.closed &&
          this.creating === 0 &&
          this.count(qos) + (this.reserved.get(qos) ?? 0) < this.target(qos)
        ) {
          // its place is held while it starts: scrubbed shells coming back meanwhile count it
          this.reserved.set(qos, (this.reserved.get(qos) ?? 0) + 1);
          let shell: WarmShell;
          try {
            shell = await this.factory.createShell(qos);
          } catch (error) {
            this.unreserve(qos);
            throw error;
          }
          if (this.closed) {
            this.unreserve(qos);
            await this.factory.destroyShell(shell);
            return;
          }
          this.put(shell, true);
          this.backoffMs = 0;
        }
      }
    } catch (error) {
      this.backoffMs = Math.min(MAX_REFILL_BACKOFF_MS, Math.max(1000, this.backoffMs * 2));
      this.logger.warn({ error: messageOf(error), retryInMs: this.backoffMs }, 'cannot refill the warm pool');
    } finally {
      this.refilling = false;
    }
    if (this.creating > 0 || this.backoffMs > 0) this.scheduleRefill(this.backoffMs || IDLE_BEFORE_REFILL_MS);
  }

  /** Waits until the pool holds its target (for benchmarks and tests), or fails after `timeoutMs`. */
  async filled(timeoutMs = 600_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while ((['latency', 'best_effort'] as const).some((q) => this.count(q) < this.target(q))) {
      if (Date.now() > deadline) throw new Error('the warm pool did not fill in time');
      this.scheduleRefill(0);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /** Destroys every pooled shell; nothing is pooled afterwards. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    while (this.refilling) await new Promise((resolve) => setTimeout(resolve, 10));
    const all = [...this.shells.values()].flat();
    this.shells.clear();
    await Promise.allSettled(all.map((shell) => this.factory.destroyShell(shell)));
  }
}
