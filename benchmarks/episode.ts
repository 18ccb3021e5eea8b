import { resolve } from 'node:path';
import { EPISODE_PHASES, loadTasks, type EpisodeTimings, type Task } from '../src/env/index.ts';
import { BUILT_IN_AGENTS, RolloutRunner, type EpisodeReport } from '../src/rollout/index.ts';
import { BenchFixture } from './fixture.ts';
import { hostInfo, quantile, type BenchOptions, type BenchReport, type Metric } from './report.ts';

/** The example tasks whose oracle episodes are timed: every Harbor-shaped one the README runs. */
const EPISODE_TASKS = ['examples/tasks/hello-file', 'examples/tasks/fix-sum'];

/** Episodes per task at each concurrency (`[concurrency, episodes]`), after one warm-up episode. */
const EPISODES_AT: [number, number][] = [
  [1, 20],
  [16, 48],
];

/** The rounded value of a metric in milliseconds. */
function ms(value: number): Metric {
  return { value: Math.round(value * 10) / 10, unit: 'ms' };
}

/** One phase's p50 over the episodes (0 where a phase took no time). */
function phaseP50(timings: EpisodeTimings[], phase: keyof EpisodeTimings): number {
  return quantile(
    timings.map((t) => t[phase] ?? 0),
    0.5,
  );
}

/**
 * The oracle's episodes of `task`, `count` of them `concurrency` at a time, as `sandgym eval`
 * runs them (the embedded platform as a user gets it: its warm pool sized by the eval), after a
 * warm-up that builds the task's environment.
 */
async function timedEpisodes(
  fixture: BenchFixture,
  task: Task,
  count: number,
  concurrency: number,
): Promise<{ reports: EpisodeReport[]; wallMs: number }> {
  const oracle = BUILT_IN_AGENTS['oracle']!;
  await new RolloutRunner(fixture.platform, oracle, { concurrency: 1 }).run([task]);
  const episodes = Array.from({ length: count }, () => task);
  const started = performance.now();
  const reports = await new RolloutRunner(fixture.platform, oracle, { concurrency }).run(episodes);
  const wallMs = performance.now() - started;
  const failed = reports.filter((r) => r.outcome.kind !== 'ok' || r.reward < 1);
  if (failed.length)
    throw new Error(
      `${failed.length} of ${count} oracle episodes of ${task.id} failed: ${JSON.stringify(failed[0]?.outcome)}`,
    );
  return { reports, wallMs };
}

/**
 * episode: where an oracle episode's time goes, phase by phase (the p50 of each), and the
 * platform's overhead (every phase but the task's own commands, tests and start-up: p50 and
 * p99), for the example tasks at concurrency 1 and 16, on the embedded platform as a user gets it.
 */
export async function benchEpisode(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  const tasks = await loadTasks(EPISODE_TASKS.map((path) => resolve(path)));
  const metrics: Record<string, Metric> = {};
  for (const task of tasks) {
    for (const [concurrency, count] of EPISODES_AT) {
      options.progress(`episode: ${count} oracle episodes of ${task.id}, ${concurrency} at a time`);
      const { reports, wallMs } = await timedEpisodes(fixture, task, count, concurrency);
      const timings = reports.map((r) => r.timings ?? {});
      const overhead = reports.map((r) => r.overheadMs ?? 0);
      const at = `${task.id}_c${concurrency}`;
      // at 16 on 2 cores an episode mostly waits its turn: its rate is the figure, not its latency
      metrics[`${at}_episodes_per_s`] = {
        value: Math.round((count / (wallMs / 1000)) * 100) / 100,
        unit: 'episodes/s',
      };
      metrics[`${at}_overhead_p50_ms`] = ms(quantile(overhead, 0.5));
      metrics[`${at}_overhead_p99_ms`] = ms(quantile(overhead, 0.99));
      metrics[`${at}_episode_p50_ms`] = ms(
        quantile(
          reports.map((r) => r.durationMs),
          0.5,
        ),
      );
      for (const phase of EPISODE_PHASES) {
        const p50 = phaseP50(timings, phase);
        if (p50 > 0) metrics[`${at}_${phase}_p50_ms`] = ms(p50);
      }
      options.progress(
        `episode: ${task.id} at ${concurrency}: ${metrics[`${at}_episodes_per_s`]!.value} episodes/s, overhead p50 ${metrics[`${at}_overhead_p50_ms`]!.value} ms; ${EPISODE_PHASES.map((p) => `${p} ${Math.round(phaseP50(timings, p))}`).join(', ')}`,
      );
    }
  }
  return { bench: 'episode', host: hostInfo(), metrics };
}
