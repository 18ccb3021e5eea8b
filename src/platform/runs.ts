import { readFile } from 'node:fs/promises';
import { z } from 'zod';
import { SandgymError, parseAt, settleAll, writeFileAtomic, type Logger } from '../common/index.ts';
import type { BackendSandbox } from '../backends/index.ts';

/** The phases a trainer publishes. */
export type TrainingPhase = 'rollout' | 'weight_sync' | 'train' | 'preempted' | 'resumed';

/**
 * At `preempted`, an expected length below this keeps the sandboxes' processes (frozen, memory to
 * swap) instead of dumping them: a CRIU dump and restore cost 0.2-0.5 s of a sandbox's time each
 * here (a hundred or more of a run's, two cores busy for seconds), against milliseconds to
 * thaw, which a minute away from its GPUs does not repay.
 */
const SHORT_PREEMPTION_MS = 60_000;

/** Options for {@link Run.phase}. */
export interface PhaseOptions {
  /**
   * How long the trainer expects the phase to last, in ms. At `preempted`, under a minute
   * the sandboxes are frozen and their memory pushed to swap rather
   * than dumped (`keptMemory` says so where no swap took it); unset or longer, dumped.
   */
  expectedMs?: number | undefined;
}

/** Options for {@link PlatformClient.startRun}. */
export interface RunOptions {
  name: string;
  /** The trainer renews within this; when it lapses, the run's sandboxes hibernate. */
  leaseMs: number;
  /**
   * The grace after a lapse: how long the run and its hibernated sandboxes are kept for a
   * restarted trainer to resume by name, before they are destroyed. Default 5 × leaseMs.
   */
  ttlMs?: number | undefined;
}

/** Where a run stands. */
export interface RunStatus {
  name: string;
  phase: TrainingPhase;
  lapsed: boolean;
  sandboxes: number;
}

/** What a phase change did to the run's sandboxes. */
export interface PhaseReport {
  phase: TrainingPhase;
  paused: string[];
  hibernated: string[];
  resumed: string[];
  /**
   * Of `resumed` at `rollout`/`resumed`: hibernated sandboxes whose restore had started, all at
   * once, but not ended when the call returned. A request to one waits for its own restore only
   * (it goes first among those still queued); one that fails leaves its sandbox `failed`.
   */
  restoring: string[];
  /**
   * Sandboxes with a request in flight, left running. At `preempted` they hibernate as soon as
   * their last request ends.
   */
  busy: string[];
  freedBytes: number;
  /**
   * At `preempted`, the sandboxes whose hibernation could not free their memory (CRIU could not
   * dump them and there is no swap for it): only paused, listed in `paused` too, and why.
   */
  keptMemory: { sandboxId: string; reason: string }[];
}

/** A trainer's handle on its run: every sandbox created with `run: name` belongs to it. */
export interface Run extends AsyncDisposable {
  readonly name: string;
  /** Extends the lease; a lapsed run's sandboxes resume if its phase is `rollout` or `resumed`. */
  renew(): Promise<RunStatus>;
  /**
   * Applies the phase policy: freeze idle sandboxes in `train`/`weight_sync`, hibernate them on
   * `preempted` (busy ones when their request ends), resume them on `rollout`/`resumed`.
   */
  phase(phase: TrainingPhase, options?: PhaseOptions): Promise<PhaseReport>;
  /** Destroys every sandbox and trajectory log of the run, at once. */
  end(): Promise<{ destroyed: string[] }>;
}

/** The project of callers that name none (the embedded platform, a node without a controller). */
export const DEFAULT_PROJECT = 'default';

/** The labels that tie a sandbox to its project and run. */
export const PROJECT_LABEL = 'sandgym.project';
export const RUN_LABEL = 'sandgym.run';

const runRecordSchema = z.object({
  project: z.string(),
  name: z.string(),
  leaseMs: z.number(),
  ttlMs: z.number(),
  expiresAt: z.number(),
  phase: z.enum(['rollout', 'weight_sync', 'train', 'preempted', 'resumed']),
  lapsed: z.boolean(),
  /** Environments made from the run's sandboxes (checkpoints): removed with the run. */
  snapshots: z.array(z.string()).default([]),
  /** Members that were busy when the run was preempted or lapsed: they hibernate once idle. */
  hibernateWhenIdle: z.array(z.string()).default([]),
});
type RunRecord = z.infer<typeof runRecordSchema>;
const runFileSchema = z.object({ runs: z.array(runRecordSchema) });

/** A run as the cluster's shared state (etcd) describes it. */
export interface SharedRun {
  name: string;
  leaseMs: number;
  ttlMs: number;
  phase: TrainingPhase;
}

/** How a run manager reaches the sandboxes it governs. */
export interface RunSandboxes {
  live(): Promise<BackendSandbox[]>;
  destroy(sandbox: BackendSandbox): Promise<void>;
  dropLog(sandboxId: string): Promise<void>;
  /** Removes an environment a run's sandbox was packed into, from the run's project. */
  dropSnapshot(project: string, environment: string): Promise<void>;
}

/**
 * The runs of one node: leases, phases and cleanup. State is kept in a crash-safe file, so a
 * restarted node agent enforces the same leases. A timer hibernates the sandboxes of a lapsed
 * run (and those a preemption found busy, once idle) and destroys an expired run's.
 */
export class RunManager {
  private readonly runs = new Map<string, RunRecord>();
  /** Runs whose sandboxes a renewal is bringing back: no lapse until that is done. */
  private readonly resuming = new Set<RunRecord>();
  /** Per run, the restores its last `rollout`/`resumed` left running: the next phase waits for them. */
  private readonly restores = new Map<string, Promise<void>>();
  private timer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> = Promise.resolve();
  /**
   * Set when leases live in etcd: this node then lapses a run only when etcd says its lease
   * ended, never by its own clock, and reports a run whose grace ran out here.
   */
  private sharedLeases: { expired: (project: string, name: string) => Promise<void> } | undefined;

  private constructor(
    private readonly file: string,
    private readonly sandboxes: RunSandboxes,
    private readonly logger: Logger,
  ) {}

  static async open(
    file: string,
    sandboxes: RunSandboxes,
    logger: Logger,
    sweepMs = 250,
  ): Promise<RunManager> {
    const manager = new RunManager(file, sandboxes, logger);
    const text = await readFile(file, 'utf8').catch(() => undefined);
    if (text) {
      for (const run of parseAt(runFileSchema, JSON.parse(text), `run state ${file}`).runs) {
        manager.runs.set(key(run.project, run.name), run);
      }
    }
    manager.timer = setInterval(() => {
      manager.sweeping = manager.sweeping
        .then(() => manager.sweep())
        .catch((error: unknown) => {
          logger.warn({ err: error }, 'run sweep failed');
        });
    }, sweepMs);
    manager.timer.unref();
    return manager;
  }

  private async save(): Promise<void> {
    await writeFileAtomic(this.file, JSON.stringify({ runs: [...this.runs.values()] }));
  }

  private find(project: string, name: string): RunRecord {
    const run = this.runs.get(key(project, name));
    if (!run) throw new SandgymError('not_found', `No run "${name}": start it with platform.startRun()`);
    return run;
  }

  /** Throws `not_found` unless `project` has the run: another project's of that name is another run. */
  resolve(project: string, name: string): void {
    this.find(project, name);
  }

  /** Checks that a sandbox may join the run, before it is created. */
  require(project: string, name: string): void {
    const run = this.find(project, name);
    if (run.lapsed) {
      throw new SandgymError(
        'failed_precondition',
        `Run "${name}" has a lapsed lease; renew it before creating sandboxes`,
      );
    }
  }

  private async members(run: RunRecord): Promise<BackendSandbox[]> {
    return (await this.sandboxes.live()).filter(
      (s) => s.labels[RUN_LABEL] === run.name && (s.labels[PROJECT_LABEL] ?? 'default') === run.project,
    );
  }

  private async status(run: RunRecord): Promise<RunStatus> {
    const sandboxes = (await this.members(run)).length;
    return { name: run.name, phase: run.phase, lapsed: run.lapsed, sandboxes };
  }

  async start(project: string, options: RunOptions): Promise<RunStatus> {
    const existing = this.runs.get(key(project, options.name));
    const run: RunRecord = {
      project,
      name: options.name,
      leaseMs: options.leaseMs,
      ttlMs: options.ttlMs ?? options.leaseMs * 5,
      expiresAt: Date.now() + options.leaseMs,
      phase: existing?.phase ?? 'rollout',
      lapsed: false,
      snapshots: existing?.snapshots ?? [],
      hibernateWhenIdle: existing?.hibernateWhenIdle ?? [],
    };
    this.runs.set(key(project, run.name), run);
    await this.save();
    if (existing?.lapsed) await this.resumeAfterLapse(run);
    return this.status(run);
  }

  async renew(project: string, name: string): Promise<RunStatus> {
    const run = this.find(project, name);
    run.expiresAt = Date.now() + run.leaseMs;
    const wasLapsed = run.lapsed;
    run.lapsed = false;
    await this.save();
    if (wasLapsed) await this.resumeAfterLapse(run);
    return this.status(run);
  }

  async setPhase(
    project: string,
    name: string,
    phase: TrainingPhase,
    options: PhaseOptions = {},
  ): Promise<PhaseReport> {
    const keepProcesses = options.expectedMs !== undefined && options.expectedMs < SHORT_PREEMPTION_MS;
    const run = this.find(project, name);
    // a preemption right after a rollout applies to sandboxes that are back, not half restored
    await this.restores.get(key(project, name));
    run.phase = phase;
    run.hibernateWhenIdle = [];
    const report: PhaseReport = {
      phase,
      paused: [],
      hibernated: [],
      resumed: [],
      restoring: [],
      busy: [],
      freedBytes: 0,
      keptMemory: [],
    };
    const members = await this.members(run);
    await this.save();
    const restores: Promise<void>[] = [];
    await settleAll(
      members.map(async (sandbox) => {
        if (phase === 'rollout' || phase === 'resumed') {
          if (sandbox.state !== 'paused' && sandbox.state !== 'hibernated') return;
          report.resumed.push(sandbox.id);
          if (sandbox.state === 'paused') return sandbox.resume();
          // started all at once, not awaited: the trainer's first request waits for its own only
          report.restoring.push(sandbox.id);
          restores.push(
            sandbox.resume().catch((error: unknown) => {
              this.logger.warn({ sandbox: sandbox.id, err: error }, 'restore at rollout failed');
            }),
          );
          return;
        }
        if (sandbox.activeCalls > 0) {
          report.busy.push(sandbox.id); // a step is running in it: leave it be
          // preempted: the sweep hibernates it as soon as its last request ends
          if (phase === 'preempted') run.hibernateWhenIdle.push(sandbox.id);
          return;
        }
        if (phase === 'preempted') {
          const hibernated = await sandbox.hibernate(keepProcesses ? { keepProcesses } : {});
          report.freedBytes += hibernated.freedBytes;
          if (hibernated.state === 'hibernated') {
            report.hibernated.push(sandbox.id);
          } else {
            report.paused.push(sandbox.id);
            report.keptMemory.push({ sandboxId: sandbox.id, reason: hibernated.reason ?? 'unknown' });
          }
        } else if (sandbox.state === 'running') {
          await sandbox.pause();
          report.paused.push(sandbox.id);
        }
      }),
      `Phase ${phase} could not be applied to every sandbox of run ${name}`,
    );
    if (run.hibernateWhenIdle.length > 0) await this.save();
    if (restores.length > 0) this.trackRestores(key(project, name), restores);
    // what ended while the others were being started is back already
    report.restoring = report.restoring.filter(
      (id) => members.find((s) => s.id === id)?.state === 'hibernated',
    );
    return report;
  }

  /** Keeps a run's background restores until every one has ended, for the next phase to wait on. */
  private trackRestores(runKey: string, restores: Promise<void>[]): void {
    const all: Promise<void> = Promise.all(restores).then(() => {
      if (this.restores.get(runKey) === all) this.restores.delete(runKey);
    });
    this.restores.set(runKey, all);
  }

  /**
   * Leases are kept in etcd from now on: {@link follow} and {@link lapse} bring what etcd says,
   * and `expired` is told when a lapsed run's grace ends here.
   */
  useSharedLeases(expired: (project: string, name: string) => Promise<void>): void {
    this.sharedLeases = { expired };
  }

  /** The runs this node knows, as project and name. */
  known(): { project: string; name: string }[] {
    return [...this.runs.values()].map(({ project, name }) => ({ project, name }));
  }

  /**
   * Brings this node in line with a run as etcd has it: known (so sandboxes may join it here even
   * if this node missed the StartRun), in its phase, and lapsed or not as its lease is.
   */
  async follow(project: string, shared: SharedRun, leaseAlive: boolean): Promise<void> {
    let run = this.runs.get(key(project, shared.name));
    if (!run) {
      run = {
        project,
        name: shared.name,
        leaseMs: shared.leaseMs,
        ttlMs: shared.ttlMs,
        expiresAt: Date.now() + shared.leaseMs,
        phase: shared.phase,
        lapsed: false,
        snapshots: [],
        hibernateWhenIdle: [],
      };
      this.runs.set(key(project, run.name), run);
      await this.save();
    } else if (run.leaseMs !== shared.leaseMs || run.ttlMs !== shared.ttlMs) {
      run.leaseMs = shared.leaseMs;
      run.ttlMs = shared.ttlMs;
      await this.save();
    }
    if (run.phase !== shared.phase) await this.setPhase(project, shared.name, shared.phase);
    if (!leaseAlive) await this.lapse(project, shared.name);
    else if (run.lapsed) await this.renew(project, shared.name);
  }

  /** The run's lease ended (etcd says so): hibernate its sandboxes and start its grace. */
  async lapse(project: string, name: string): Promise<void> {
    const run = this.runs.get(key(project, name));
    if (!run || run.lapsed) return;
    run.lapsed = true;
    run.expiresAt = Date.now();
    await this.save();
    const { hibernated, keptMemory } = await this.hibernateIdle(run, await this.members(run));
    this.logger.info(
      { run: run.name, hibernated: hibernated.length, keptMemory, graceMs: run.ttlMs },
      'run lease lapsed in etcd: sandboxes hibernated',
    );
  }

  /** Ends a run here if this node knows it (another node or replica ended it in etcd). */
  async endIfKnown(project: string, name: string): Promise<void> {
    if (this.runs.has(key(project, name))) await this.end(project, name);
  }

  /** Records a snapshot (an environment) made from one of the run's sandboxes, so the run owns it. */
  async addSnapshot(sandbox: Pick<BackendSandbox, 'labels'>, environment: string): Promise<void> {
    const name = sandbox.labels[RUN_LABEL];
    const run = name ? this.runs.get(key(sandbox.labels[PROJECT_LABEL] ?? DEFAULT_PROJECT, name)) : undefined;
    if (!run) return;
    run.snapshots.push(environment);
    await this.save();
  }

  async end(project: string, name: string): Promise<{ destroyed: string[] }> {
    const run = this.find(project, name);
    await this.restores.get(key(project, name)); // a sandbox is destroyed whole, not mid-restore
    this.runs.delete(key(project, name));
    await this.save();
    return this.destroyAll(run);
  }

  /**
   * A renewed lease brings the run's sandboxes back to what its phase wants: running in
   * `rollout`/`resumed`; in the other phases they stay frozen or hibernated.
   */
  private async resumeAfterLapse(run: RunRecord): Promise<void> {
    run.hibernateWhenIdle = [];
    await this.save();
    if (run.phase !== 'rollout' && run.phase !== 'resumed') return;
    this.resuming.add(run);
    try {
      await settleAll(
        (await this.members(run))
          .filter((s) => s.state === 'paused' || s.state === 'hibernated')
          .map((s) => s.resume()),
        `Some sandboxes of run ${run.name} did not resume`,
      );
    } finally {
      this.resuming.delete(run);
      // restores can take longer than a short lease: it counts from when they are done
      run.expiresAt = Date.now() + run.leaseMs;
      await this.save();
    }
  }

  /**
   * Hibernates the run's idle sandboxes and marks its busy ones to follow when their request
   * ends: what a preemption or a lapsed lease does. The ids it hibernated, and those it could
   * only pause (their memory stayed resident) with why.
   */
  private async hibernateIdle(
    run: RunRecord,
    candidates: readonly BackendSandbox[],
  ): Promise<Pick<PhaseReport, 'hibernated' | 'keptMemory'>> {
    const idle = candidates.filter((s) => s.activeCalls === 0);
    const busy = candidates.filter((s) => s.activeCalls > 0).map((s) => s.id);
    const pending = new Set(run.hibernateWhenIdle);
    for (const s of idle) pending.delete(s.id);
    for (const id of busy) pending.add(id);
    if (!sameMembers(pending, run.hibernateWhenIdle)) {
      run.hibernateWhenIdle = [...pending];
      await this.save();
    }
    const done: Pick<PhaseReport, 'hibernated' | 'keptMemory'> = { hibernated: [], keptMemory: [] };
    await settleAll(
      idle.filter(canHibernate).map(async (sandbox) => {
        const report = await sandbox.hibernate();
        if (report.state === 'hibernated') done.hibernated.push(sandbox.id);
        else done.keptMemory.push({ sandboxId: sandbox.id, reason: report.reason ?? 'unknown' });
      }),
      `Some sandboxes of run ${run.name} did not hibernate`,
    );
    return done;
  }

  private async destroyAll(run: RunRecord): Promise<{ destroyed: string[] }> {
    const members = await this.members(run);
    await settleAll(
      members.map(async (sandbox) => {
        await this.sandboxes.destroy(sandbox);
        await this.sandboxes.dropLog(sandbox.id);
      }),
      `Some sandboxes of run ${run.name} were not destroyed`,
    );
    await settleAll(
      run.snapshots.map((environment) => this.sandboxes.dropSnapshot(run.project, environment)),
      `Some snapshots of run ${run.name} were not removed`,
    );
    return { destroyed: members.map((s) => s.id) };
  }

  /** Hibernates the sandboxes of lapsed runs, and busy ones a preemption left, and cleans up expired runs. */
  private async sweep(): Promise<void> {
    const now = Date.now();
    for (const run of [...this.runs.values()]) {
      if (run.hibernateWhenIdle.length > 0) {
        const waiting = new Set(run.hibernateWhenIdle);
        const members = (await this.members(run)).filter((s) => waiting.has(s.id));
        const gone = run.hibernateWhenIdle.filter((id) => !members.some((s) => s.id === id));
        if (gone.length) {
          run.hibernateWhenIdle = run.hibernateWhenIdle.filter((id) => !gone.includes(id));
          await this.save();
        }
        const { hibernated, keptMemory } = await this.hibernateIdle(run, members);
        if (hibernated.length || keptMemory.length)
          this.logger.info(
            { run: run.name, hibernated, keptMemory },
            'run: sandboxes hibernated once their request ended',
          );
      }
      // with leases in etcd, only a lapse etcd reported starts the grace
      const shared = this.sharedLeases;
      if (now >= run.expiresAt + run.ttlMs && (!shared || run.lapsed)) {
        this.runs.delete(key(run.project, run.name));
        await this.save();
        const { destroyed } = await this.destroyAll(run);
        this.logger.info({ run: run.name, destroyed: destroyed.length }, 'run expired: cleaned up');
        await shared?.expired(run.project, run.name);
      } else if (!shared && now >= run.expiresAt && !run.lapsed && !this.resuming.has(run)) {
        run.lapsed = true;
        await this.save();
        // the trainer is gone: free what its sandboxes hold, and keep them for the grace
        const { hibernated, keptMemory } = await this.hibernateIdle(run, await this.members(run));
        this.logger.info(
          { run: run.name, hibernated: hibernated.length, keptMemory, graceMs: run.ttlMs },
          'run lease lapsed: sandboxes hibernated',
        );
      }
    }
  }

  close(): void {
    clearInterval(this.timer);
  }
}

/** Running or frozen: the states hibernation applies to. */
function canHibernate(sandbox: BackendSandbox): boolean {
  return sandbox.state === 'running' || sandbox.state === 'paused';
}

function sameMembers(set: ReadonlySet<string>, list: readonly string[]): boolean {
  return set.size === list.length && list.every((id) => set.has(id));
}

function key(project: string, name: string): string {
  return `${project}/${name}`;
}
