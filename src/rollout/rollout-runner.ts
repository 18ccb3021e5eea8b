import { Subject, filter, map, type Observable } from 'rxjs';
import type { Task } from '../env/index.ts';
import type { PlatformClient } from '../platform/index.ts';
import type { Agent } from './agents.ts';
import type { EpisodeReport, LifecycleEvent, StepEvent } from './episode-report.ts';
import { evaluate, type EvaluateOptions } from './evaluate.ts';

/** A reward as `rewards$` emits it: only episodes the platform completed, never infra failures. */
export interface RewardEvent {
  task: string;
  reward: number;
}

/**
 * Runs episodes of a policy over tasks, with a concurrency limit and continuous refill, and
 * publishes what happens as rxjs streams. Promises and AsyncIterables at the edge: `run()`
 * resolves with every report, `finished()` yields them as they come.
 *
 * @example
 * ```ts
 * const runner = new RolloutRunner(platform, BUILT_IN_AGENTS['oracle']!, { concurrency: 4 });
 * runner.rewards$.subscribe(({ task, reward }) => console.log(task, reward));
 * const episodes = await runner.run(await loadTasks(['examples/tasks']));
 * ```
 */
export class RolloutRunner {
  private readonly stepSubject = new Subject<StepEvent>();
  private readonly episodeSubject = new Subject<EpisodeReport>();
  private readonly lifecycleSubject = new Subject<LifecycleEvent>();

  readonly steps$: Observable<StepEvent> = this.stepSubject.asObservable();
  readonly episodes$: Observable<EpisodeReport> = this.episodeSubject.asObservable();
  readonly lifecycle$: Observable<LifecycleEvent> = this.lifecycleSubject.asObservable();
  /** Infrastructure outcomes are masked here: they are not rewards. */
  readonly rewards$: Observable<RewardEvent> = this.episodes$.pipe(
    filter((e) => e.outcome.kind === 'ok'),
    map((e) => ({ task: e.task, reward: e.reward })),
  );

  constructor(
    private readonly platform: PlatformClient,
    private readonly makeAgent: () => Agent,
    private readonly options: Omit<EvaluateOptions, 'onStep' | 'onEpisode' | 'onLifecycle'>,
  ) {}

  /** Runs one episode per task; the streams complete when it returns. */
  async run(tasks: Task[]): Promise<EpisodeReport[]> {
    try {
      return await evaluate(this.platform, tasks, this.makeAgent, {
        ...this.options,
        onStep: (event) => this.stepSubject.next(event),
        onEpisode: (report) => this.episodeSubject.next(report),
        onLifecycle: (event) => this.lifecycleSubject.next(event),
      });
    } finally {
      this.stepSubject.complete();
      this.episodeSubject.complete();
      this.lifecycleSubject.complete();
    }
  }

  /** Finished episodes as they come, for pull-style consumers; subscribe before `run()`. */
  async *finished(): AsyncIterable<EpisodeReport> {
    const queue: EpisodeReport[] = [];
    let done = false;
    let wake: (() => void) | undefined;
    const subscription = this.episodes$.subscribe({
      next: (report) => {
        queue.push(report);
        wake?.();
      },
      complete: () => {
        done = true;
        wake?.();
      },
    });
    try {
      for (;;) {
        const next = queue.shift();
        if (next) yield next;
        else if (done) return;
        else await new Promise<void>((resolve) => (wake = resolve));
      }
    } finally {
      subscription.unsubscribe();
    }
  }
}
