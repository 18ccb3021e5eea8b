import { rm } from 'node:fs/promises';
import { resolve } from 'node:path';
import { loadTasks, type Task } from '../src/env/index.ts';
import {
  LayerStore,
  Platform,
  defaultDataDir,
  defaultStoreDir,
  type BuildStep,
  type LocalPlatform,
} from '../src/platform/index.ts';
import { compared, hostInfo, type BenchOptions, type BenchReport, type Metric } from './report.ts';

/** The published-shape task folders the suite's fixtures hold: every Dockerfile-built format. */
const SUITES = ['test/fixtures/tasks/harbor', 'test/fixtures/tasks/terminal-bench', 'examples/tasks'];

/** Every Dockerfile a task builds: its own and its services'. */
function dockerfilesOf(task: Task): { name: string; file: string; context: string }[] {
  const own =
    task.environment.kind === 'dockerfile'
      ? [{ name: task.id, file: task.environment.dockerfile, context: task.environment.context }]
      : [];
  const services = (task.services ?? []).flatMap((s) =>
    s.source.kind === 'dockerfile'
      ? [{ name: `${task.id}/${s.name}`, file: s.source.dockerfile, context: s.source.context }]
      : [],
  );
  return [...own, ...services];
}

interface Pass {
  ms: Record<string, number>;
  steps: BuildStep[];
}

async function buildAll(
  platform: LocalPlatform,
  builds: ReturnType<typeof dockerfilesOf>,
  progress: (m: string) => void,
): Promise<Pass> {
  const pass: Pass = { ms: {}, steps: [] };
  for (const [i, build] of builds.entries()) {
    const started = performance.now();
    const result = await platform.buildFromDockerfile({
      file: build.file,
      context: build.context,
      name: `bench-task-${i}:1`,
    });
    pass.ms[build.name] = performance.now() - started;
    pass.steps.push(...result.steps);
    progress(`tasks: ${build.name} in ${Math.round(pass.ms[build.name]!)} ms`);
  }
  return pass;
}

/** The share of layer steps (RUN, COPY, ADD, WORKDIR) a pass took from the cache. */
function hitRate(steps: BuildStep[]): Metric {
  const layered = steps.filter((s) => s.outcome !== 'config');
  const cached = layered.filter((s) => s.outcome === 'cached').length;
  return { value: Math.round((cached / Math.max(1, layered.length)) * 1000) / 10, unit: '%' };
}

/**
 * tasks: every task environment of the fixture suites built twice in a fresh project store, the
 * way `sandgym eval` builds them: first with an empty step cache (where only steps tasks share
 * are hits, such as one `apt-get install` line used twice), then again with the cache warm. Each
 * task's warm build is reported against its cold one, with the cache hit rate of each pass.
 */
export async function benchTasks(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-tasks-${process.pid}`);
  const storeDir = resolve(dataDir, 'store');
  // a store of its own, seeded with the base environments: the step cache starts empty
  const store = await LayerStore.open(storeDir);
  const shared = await LayerStore.open(defaultStoreDir(base));
  for (const ref of ['busybox:latest', 'debian:bookworm']) await store.importEnvironment(shared, ref);
  const platform = await Platform.local({ dataDir, storeDir });
  try {
    const tasks = await loadTasks(SUITES.map((s) => resolve(s)));
    const builds = tasks.flatMap(dockerfilesOf);
    options.progress(`tasks: ${builds.length} Dockerfiles of ${tasks.length} tasks, cold`);
    const cold = await buildAll(platform, builds, (m) => options.progress(m));
    options.progress('tasks: the same, warm');
    const warm = await buildAll(platform, builds, (m) => options.progress(m));
    const metrics: Record<string, Metric> = {
      cache_hit_rate_cold_pass: hitRate(cold.steps),
      cache_hit_rate_warm_pass: hitRate(warm.steps),
      // ratio = warm / cold for the whole suite
      suite_warm_vs_cold_ms: compared(
        Object.values(warm.ms).reduce((a, b) => a + b, 0),
        Object.values(cold.ms).reduce((a, b) => a + b, 0),
      ),
    };
    for (const build of builds)
      metrics[`build_${build.name}_warm_vs_cold_ms`] = compared(warm.ms[build.name]!, cold.ms[build.name]!);
    return { bench: 'tasks', host: hostInfo(), metrics };
  } finally {
    await platform.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}
