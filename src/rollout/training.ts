import { Subject, type Observable } from 'rxjs';
import { messageOf, type Logger } from '../common/index.ts';
import type { PhaseReport, PlatformClient, Run, RunOptions, TrainingPhase } from '../platform/index.ts';
import type { LifecycleEvent } from './episode-report.ts';

/** A phase the trainer published and what it did. */
export interface PhaseEvent {
  run: string;
  phase: TrainingPhase;
  at: string;
  report: PhaseReport;
}

/** Options for {@link TrainingCoordinator.start}. */
export interface TrainingCoordinatorOptions extends RunOptions {
  /** How often the lease is renewed; default a third of leaseMs. */
  renewEveryMs?: number;
  logger?: Logger;
}

/**
 * Couples a trainer to its sandboxes: it owns a run, keeps its lease alive while the trainer
 * lives, and publishes training phases. `phases$` shows each phase and its effect; `lifecycle$`
 * each sandbox the phases paused, hibernated, resumed or ended. Stop renewing (the trainer
 * crashed) and the platform pauses the run's sandboxes by itself.
 */
export class TrainingCoordinator implements AsyncDisposable {
  private readonly phaseSubject = new Subject<PhaseEvent>();
  private readonly lifecycleSubject = new Subject<LifecycleEvent>();
  readonly phases$: Observable<PhaseEvent> = this.phaseSubject.asObservable();
  readonly lifecycle$: Observable<LifecycleEvent> = this.lifecycleSubject.asObservable();
  private readonly timer: NodeJS.Timeout;
  private ended = false;

  private constructor(
    readonly run: Run,
    renewEveryMs: number,
    logger: Logger | undefined,
  ) {
    this.timer = setInterval(() => {
      run
        .renew()
        .catch((error: unknown) =>
          logger?.warn({ run: run.name, error: messageOf(error) }, 'lease renewal failed'),
        );
    }, renewEveryMs);
    this.timer.unref();
  }

  static async start(
    platform: PlatformClient,
    options: TrainingCoordinatorOptions,
  ): Promise<TrainingCoordinator> {
    const { renewEveryMs, logger, ...runOptions } = options;
    const run = await platform.startRun(runOptions);
    return new TrainingCoordinator(
      run,
      renewEveryMs ?? Math.max(50, Math.floor(options.leaseMs / 3)),
      logger,
    );
  }

  /** The run's name: pass it as `run` in sandbox requests. */
  get name(): string {
    return this.run.name;
  }

  /** Publishes a phase; resolves with what it did to the run's sandboxes. */
  async phase(phase: TrainingPhase): Promise<PhaseReport> {
    const report = await this.run.phase(phase);
    this.phaseSubject.next({ run: this.run.name, phase, at: new Date().toISOString(), report });
    const cause = `phase:${phase}`;
    for (const sandboxId of report.paused) this.lifecycleSubject.next({ sandboxId, state: 'paused', cause });
    for (const sandboxId of report.hibernated)
      this.lifecycleSubject.next({ sandboxId, state: 'hibernated', cause });
    for (const sandboxId of report.resumed)
      this.lifecycleSubject.next({ sandboxId, state: 'running', cause });
    return report;
  }

  /** Ends the run (destroying its sandboxes) and completes the streams. Idempotent. */
  async end(): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    clearInterval(this.timer);
    try {
      const { destroyed } = await this.run.end();
      for (const sandboxId of destroyed)
        this.lifecycleSubject.next({ sandboxId, state: 'stopped', cause: 'end' });
    } finally {
      this.phaseSubject.complete();
      this.lifecycleSubject.complete();
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.end();
  }
}
