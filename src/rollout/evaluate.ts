import { TaskEnv, type StepOutcome, type Task } from '../env/index.ts';
import type { LocalPlatform } from '../platform/index.ts';
import type { Agent } from './agents.ts';
import type { EvalJournal } from './eval-journal.ts';
import type { EpisodeReport, EvalProgress, LifecycleEvent, StepEvent } from './episode-report.ts';

/** Options for {@link evaluate}. */
export interface EvaluateOptions {
  concurrency: number;
  maxSteps?: number;
  onProgress?: (progress: EvalProgress) => void;
  onEpisode?: (report: EpisodeReport) => void;
  /** Every step as it completes, with how long it took. */
  onStep?: (step: StepEvent) => void;
  /** A sandbox of an episode started (`running`) or was torn down (`stopped`). */
  onLifecycle?: (event: LifecycleEvent) => void;
  /** Finished episodes survive a crash here; a task already in it is not run again. */
  journal?: EvalJournal;
}

async function runEpisode(
  platform: LocalPlatform,
  task: Task,
  agent: Agent,
  maxSteps: number,
  options: EvaluateOptions,
): Promise<EpisodeReport> {
  const started = performance.now();
  await using env = TaskEnv.create(platform, task);
  let { observation, info } = await env.reset();
  const episodeId = String(info['episodeId']);
  const sandboxId = String(info['sandboxId']);
  options.onLifecycle?.({ task: task.id, sandboxId, state: 'running' });
  const report = (
    steps: number,
    reward: number,
    outcome: StepOutcome,
    tampered: string[],
  ): EpisodeReport => ({
    task: task.id,
    reward,
    outcome,
    steps,
    durationMs: performance.now() - started,
    tampered,
  });
  try {
    for (let stepIndex = 0; stepIndex < maxSteps; stepIndex++) {
      const action = await agent(observation, { task, stepIndex });
      const stepStarted = performance.now();
      const result = await env.step(action);
      options.onStep?.({
        task: task.id,
        episodeId,
        stepIndex,
        action: action.type,
        reward: result.reward,
        outcome: result.outcome.kind,
        durationMs: performance.now() - stepStarted,
      });
      observation = result.observation;
      ({ info } = result);
      if (result.outcome.kind !== 'ok' || result.terminated || result.truncated) {
        const grade = info['grade'] as { tampered?: string[] } | undefined;
        return report(stepIndex + 1, result.reward, result.outcome, grade?.tampered ?? []);
      }
    }
    // ran out of steps: grade what is there, as a truncation
    const grade = await env.grade();
    return report(maxSteps, grade.reward, { kind: 'ok' }, grade.tampered);
  } finally {
    options.onLifecycle?.({ task: task.id, sandboxId, state: 'stopped' });
  }
}

/**
 * Runs one episode per task with at most `concurrency` at once, refilling as each finishes. An
 * episode that throws is reported with an `infra_failure` outcome, never as a reward of 0.
 */
export async function evaluate(
  platform: LocalPlatform,
  tasks: Task[],
  makeAgent: () => Agent,
  options: EvaluateOptions,
): Promise<EpisodeReport[]> {
  const reports: EpisodeReport[] = new Array<EpisodeReport>(tasks.length);
  const started = performance.now();
  let next = 0;
  let done = 0;
  let running = 0;
  let failed = 0;
  const progress = (): void => {
    const elapsed = performance.now() - started;
    options.onProgress?.({
      done,
      running,
      failed,
      total: tasks.length,
      etaMs: done ? (elapsed / done) * (tasks.length - done) : undefined,
    });
  };
  const worker = async (): Promise<void> => {
    while (next < tasks.length) {
      const index = next++;
      const task = tasks[index]!;
      running++;
      progress();
      let report: EpisodeReport;
      const earlier = options.journal?.get(task.id);
      try {
        report = earlier ?? (await runEpisode(platform, task, makeAgent(), options.maxSteps ?? 50, options));
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        report = {
          task: task.id,
          reward: 0,
          outcome: { kind: 'infra_failure', reason: 'platform_error', message },
          steps: 0,
          durationMs: 0,
          tampered: [],
          error: message,
        };
      }
      if (!earlier && report.outcome.kind === 'ok') await options.journal?.record(report);
      reports[index] = report;
      running--;
      done++;
      if (report.outcome.kind !== 'ok') failed++;
      options.onEpisode?.(report);
      progress();
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(options.concurrency, tasks.length)) }, worker));
  return reports;
}
