import { readFile } from 'node:fs/promises';
import { z } from 'zod';
import { SandgymError, parseAt, settleAll, writeFileAtomic, type Logger } from '../common/index.ts';
import type { BackendSandbox } from '../backends/index.ts';

/** The phases a trainer publishes. */
export type TrainingPhase = 'rollout' | 'weight_sync' | 'train' | 'preempted' | 'resumed';

/** Options for {@link PlatformClient.startRun}. */
export interface RunOptions {
  name: string;
  /** The trainer renews within this; when it lapses, the run's sandboxes are paused. */
  leaseMs: number;
  /** How long after the lease lapses the run is cleaned up. Default 5 × leaseMs. */
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
  busy: string[];
  freedBytes: number;
}

/** A trainer's handle on its run: every sandbox created with `run: name` belongs to it. */
export interface Run extends AsyncDisposable {
  readonly name: string;
  /** Extends the lease; a lapsed run's paused sandboxes resume. */
  renew(): Promise<RunStatus>;
  /** Applies the phase policy: freeze idle sandboxes in `train`/`weight_sync`, hibernate on `preempted`, resume otherwise. */
  phase(phase: TrainingPhase): Promise<PhaseReport>;
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
});
type RunRecord = z.infer<typeof runRecordSchema>;
const runFileSchema = z.object({ runs: z.array(runRecordSchema) });

/** How a run manager reaches the sandboxes it governs. */
export interface RunSandboxes {
  live(): BackendSandbox[];
  destroy(sandbox: BackendSandbox): Promise<void>;
  dropLog(sandboxId: string): Promise<void>;
  /** Removes an environment a run's sandbox was packed into, from the run's project. */
  dropSnapshot(project: string, environment: string): Promise<void>;
}

/**
 * The runs of one node: leases, phases and cleanup. State is kept in a crash-safe file, so a
 * restarted node agent enforces the same leases. A timer pauses the sandboxes of a lapsed run
 * and destroys an expired run's.
 */
export class RunManager {
  private readonly runs = new Map<string, RunRecord>();
  private timer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> = Promise.resolve();

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

  private members(run: RunRecord): BackendSandbox[] {
    return this.sandboxes
      .live()
      .filter(
        (s) => s.labels[RUN_LABEL] === run.name && (s.labels[PROJECT_LABEL] ?? 'default') === run.project,
      );
  }

  private status(run: RunRecord): RunStatus {
    return { name: run.name, phase: run.phase, lapsed: run.lapsed, sandboxes: this.members(run).length };
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
    };
    this.runs.set(key(project, run.name), run);
    await this.save();
    if (existing?.lapsed) await this.resumeAll(run);
    return this.status(run);
  }

  async renew(project: string, name: string): Promise<RunStatus> {
    const run = this.find(project, name);
    run.expiresAt = Date.now() + run.leaseMs;
    const wasLapsed = run.lapsed;
    run.lapsed = false;
    await this.save();
    if (wasLapsed) await this.resumeAll(run);
    return this.status(run);
  }

  async setPhase(project: string, name: string, phase: TrainingPhase): Promise<PhaseReport> {
    const run = this.find(project, name);
    run.phase = phase;
    await this.save();
    const report: PhaseReport = { phase, paused: [], hibernated: [], resumed: [], busy: [], freedBytes: 0 };
    const members = this.members(run);
    await settleAll(
      members.map(async (sandbox) => {
        if (phase === 'rollout' || phase === 'resumed') {
          if (sandbox.state !== 'paused' && sandbox.state !== 'hibernated') return;
          await sandbox.resume();
          report.resumed.push(sandbox.id);
          return;
        }
        if (sandbox.activeCalls > 0) {
          report.busy.push(sandbox.id); // a step is running in it: leave it be
          return;
        }
        if (phase === 'preempted') {
          const { freedBytes } = await sandbox.hibernate();
          report.hibernated.push(sandbox.id);
          report.freedBytes += freedBytes;
        } else if (sandbox.state === 'running') {
          await sandbox.pause();
          report.paused.push(sandbox.id);
        }
      }),
      `Phase ${phase} could not be applied to every sandbox of run ${name}`,
    );
    return report;
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
    this.runs.delete(key(project, name));
    await this.save();
    return this.destroyAll(run);
  }

  private async resumeAll(run: RunRecord): Promise<void> {
    await settleAll(
      this.members(run)
        .filter((s) => s.state === 'paused')
        .map((s) => s.resume()),
      `Some sandboxes of run ${run.name} did not resume`,
    );
  }

  private async destroyAll(run: RunRecord): Promise<{ destroyed: string[] }> {
    const members = this.members(run);
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

  /** Pauses the sandboxes of lapsed runs and cleans up expired ones. */
  private async sweep(): Promise<void> {
    const now = Date.now();
    for (const run of [...this.runs.values()]) {
      if (now >= run.expiresAt + run.ttlMs) {
        this.runs.delete(key(run.project, run.name));
        await this.save();
        const { destroyed } = await this.destroyAll(run);
        this.logger.info({ run: run.name, destroyed: destroyed.length }, 'run expired: cleaned up');
      } else if (now >= run.expiresAt && !run.lapsed) {
        run.lapsed = true;
        await this.save();
        const running = this.members(run).filter((s) => s.state === 'running');
        await settleAll(
          running.map((s) => s.pause()),
          `Some sandboxes of lapsed run ${run.name} did not pause`,
        );
        this.logger.info({ run: run.name, paused: running.length }, 'run lease lapsed: sandboxes paused');
      }
    }
  }

  close(): void {
    clearInterval(this.timer);
  }
}

function key(project: string, name: string): string {
  return `${project}/${name}`;
}
