import {
  Subject,
  asyncScheduler,
  catchError,
  defer,
  exhaustMap,
  interval,
  map,
  merge,
  of,
  takeUntil,
  type Observable,
  type ObservableInput,
  type SchedulerLike,
  type Subscription,
} from 'rxjs';
import { messageOf, type Logger } from '../common/index.ts';
import type {
  PhaseOptions,
  PhaseReport,
  PlatformClient,
  Run,
  RunOptions,
  RunStatus,
  TrainingPhase,
} from '../platform/index.ts';
import type { LifecycleEvent } from './episode-report.ts';

/** A phase the trainer published and what it did. */
export interface PhaseEvent {
  run: string;
  phase: TrainingPhase;
  at: string;
  report: PhaseReport;
}

/** A lease renewal: the run's status, or why it failed. */
export type LeaseEvent = { ok: true; status: RunStatus } | { ok: false; error: string };

/**
 * One event of a training loop, as {@link TrainingCoordinator.events$} joins them: a phase and
 * its report, or a sandbox's change, caused by the run (`run`: a phase, its end) or by a rollout
 * (`rollout`: an episode's sandbox started or stopped).
 */
export type TrainingEvent =
  | { kind: 'phase'; event: PhaseEvent }
  | { kind: 'lifecycle'; source: 'run' | 'rollout'; event: LifecycleEvent };

/** Signals that end a process unless handled: after their phase, they are raised again. */
const TERMINATING: readonly NodeJS.Signals[] = ['SIGTERM', 'SIGINT', 'SIGHUP'];

/** What {@link TrainingCoordinator.handleSignals} maps by default: a scheduler's notices of preemption. */
export const PREEMPTION_SIGNALS: Readonly<Partial<Record<NodeJS.Signals, TrainingPhase>>> = {
  SIGTERM: 'preempted',
  SIGUSR1: 'preempted',
};

/**
 * Renews every `periodMs` on `scheduler`'s clock and reports each outcome. A renewal still in
 * flight when the next falls due makes that tick a no-op (exhaustMap): a slow node never gets a
 * pile of renewals. A failed renewal is reported and the next tick tries again.
 */
export function leaseRenewals(
  renew: () => ObservableInput<RunStatus>,
  periodMs: number,
  scheduler: SchedulerLike,
): Observable<LeaseEvent> {
  return interval(periodMs, scheduler).pipe(
    exhaustMap(() =>
      defer(renew).pipe(
        map((status): LeaseEvent => ({ ok: true, status })),
        catchError((error: unknown) => of<LeaseEvent>({ ok: false, error: messageOf(error) })),
      ),
    ),
  );
}

/** Options for {@link TrainingCoordinator}, besides the run itself. */
export interface KeepAliveOptions {
  /** How often the lease is renewed; default a third of leaseMs. */
  renewEveryMs?: number;
  logger?: Logger;
  /** The clock of the renewals (a TestScheduler in tests). */
  scheduler?: SchedulerLike;
}

/** Options for {@link TrainingCoordinator.start}. */
export interface TrainingCoordinatorOptions extends RunOptions, KeepAliveOptions {}

/**
 * Couples a trainer to its sandboxes: it owns a run, keeps its lease alive while the trainer
 * lives, and publishes training phases. `phases$` shows each phase and its effect; `lifecycle$`
 * each sandbox the phases paused, hibernated, resumed or ended; `lease$` each renewal. Stop
 * renewing (the trainer crashed) and the platform hibernates the run's sandboxes by itself.
 */
export class TrainingCoordinator implements AsyncDisposable {
  private readonly phaseSubject = new Subject<PhaseEvent>();
  private readonly lifecycleSubject = new Subject<LifecycleEvent>();
  private readonly leaseSubject = new Subject<LeaseEvent>();
  private readonly ending = new Subject<void>();
  readonly phases$: Observable<PhaseEvent> = this.phaseSubject.asObservable();
  readonly lifecycle$: Observable<LifecycleEvent> = this.lifecycleSubject.asObservable();
  /** Each lease renewal; a renewal still in flight when the next falls due is not doubled. */
  readonly lease$: Observable<LeaseEvent> = this.leaseSubject.asObservable();
  private readonly renewals: Subscription;
  private ended = false;

  /** Keeps `run`'s lease alive every `renewEveryMs` from now on. */
  constructor(
    readonly run: Run,
    renewEveryMs: number,
    options: Omit<KeepAliveOptions, 'renewEveryMs'> = {},
  ) {
    const { logger } = options;
    this.renewals = leaseRenewals(() => run.renew(), renewEveryMs, options.scheduler ?? asyncScheduler)
      .pipe(takeUntil(this.ending))
      .subscribe((event) => {
        if (!event.ok) logger?.warn({ run: run.name, error: event.error }, 'lease renewal failed');
        this.leaseSubject.next(event);
      });
  }

  static async start(
    platform: PlatformClient,
    options: TrainingCoordinatorOptions,
  ): Promise<TrainingCoordinator> {
    const { renewEveryMs, logger, scheduler, ...runOptions } = options;
    const run = await platform.startRun(runOptions);
    return new TrainingCoordinator(run, renewEveryMs ?? Math.max(50, Math.floor(options.leaseMs / 3)), {
      ...(logger ? { logger } : {}),
      ...(scheduler ? { scheduler } : {}),
    });
  }

  /** The run's name: pass it as `run` in sandbox requests. */
  get name(): string {
    return this.run.name;
  }

  /**
   * Every phase and sandbox change of this run and of `runners`, in one stream: what a trainer's
   * dashboard or log follows. It completes when the run ends and every runner finished.
   */
  events$(...runners: readonly { lifecycle$: Observable<LifecycleEvent> }[]): Observable<TrainingEvent> {
    return merge(
      this.phases$.pipe(map((event): TrainingEvent => ({ kind: 'phase', event }))),
      this.lifecycle$.pipe(map((event): TrainingEvent => ({ kind: 'lifecycle', source: 'run', event }))),
      ...runners.map((runner) =>
        runner.lifecycle$.pipe(
          map((event): TrainingEvent => ({ kind: 'lifecycle', source: 'rollout', event })),
        ),
      ),
    );
  }

  /**
   * Publishes a phase when the process gets a signal: by default SIGTERM and SIGUSR1 (a
   * cluster scheduler's notice of preemption) hibernate the run's sandboxes. A signal that would
   * end the process (SIGTERM, SIGINT, SIGHUP) then stops the renewals and, unless another
   * handler is listening, is raised again so the process ends as it would have. The run and its
   * hibernated sandboxes stay for the run's grace: a restarted trainer calls
   * {@link TrainingCoordinator.start} with the same name, then `phase('resumed')`. Returns a
   * function that removes the handlers.
   */
  handleSignals(
    signals: Readonly<Partial<Record<NodeJS.Signals, TrainingPhase>>> = PREEMPTION_SIGNALS,
    logger?: Logger,
  ): () => void {
    const handlers = Object.entries(signals).map(([name, phase]) => {
      const signal = name as NodeJS.Signals;
      const handler = (): void => {
        const terminating = TERMINATING.includes(signal);
        if (terminating) process.off(signal, handler);
        void this.phase(phase)
          .then((report) => logger?.info({ run: this.name, signal, report }, `${signal}: phase ${phase}`))
          .catch((error: unknown) =>
            logger?.error({ run: this.name, signal, err: error }, `${signal}: phase ${phase} failed`),
          )
          .finally(() => {
            if (!terminating) return;
            this.stopRenewing();
            if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
          });
      };
      process.on(signal, handler);
      return [signal, handler] as const;
    });
    return () => {
      for (const [signal, handler] of handlers) process.off(signal, handler);
    };
  }

  /** Publishes a phase; resolves with what it did to the run's sandboxes. */
  async phase(phase: TrainingPhase, options: PhaseOptions = {}): Promise<PhaseReport> {
    const report = await this.run.phase(phase, options);
    this.phaseSubject.next({ run: this.run.name, phase, at: new Date().toISOString(), report });
    const cause = `phase:${phase}`;
    for (const sandboxId of report.paused) this.lifecycleSubject.next({ sandboxId, state: 'paused', cause });
    for (const sandboxId of report.hibernated)
      this.lifecycleSubject.next({ sandboxId, state: 'hibernated', cause });
    for (const sandboxId of report.resumed)
      this.lifecycleSubject.next({ sandboxId, state: 'running', cause });
    return report;
  }

  /** Stops the renewals without ending the run (a trainer handing over, or a test). */
  stopRenewing(): void {
    this.ending.next();
    this.renewals.unsubscribe();
  }

  /** Ends the run (destroying its sandboxes) and completes the streams. Idempotent. */
  async end(): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    this.stopRenewing();
    try {
      const { destroyed } = await this.run.end();
      for (const sandboxId of destroyed)
        this.lifecycleSubject.next({ sandboxId, state: 'stopped', cause: 'end' });
    } finally {
      this.phaseSubject.complete();
      this.lifecycleSubject.complete();
      this.leaseSubject.complete();
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.end();
  }
}
