import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import { runProgram } from '../src/backends/index.ts';
import { loadTasks, type Task } from '../src/env/index.ts';
import type { LocalPlatform } from '../src/platform/index.ts';
import { BUILT_IN_AGENTS, RolloutRunner } from '../src/rollout/index.ts';
import type { PeerEngine } from './peer-engines.ts';
import { atATime } from './report.ts';

/**
 * The example tasks a Docker harness runs as published (Harbor's layout: a Dockerfile, a
 * solution/solve.sh, a tests/test.sh that writes /logs/verifier/reward.txt), each run as many
 * trials as make up the eval.
 */
const EVAL_TASKS = ['examples/tasks/fix-sum', 'examples/tasks/hello-file'];

/** One eval the peers run: how many episodes, how many at a time. */
export interface EvalShape {
  episodes: number;
  concurrency: number;
}

/** A short eval at a trainer's usual few at a time, and a longer one at 16 (issue 30). */
export const EVAL_SHAPES: readonly EvalShape[] = [
  { episodes: 20, concurrency: 4 },
  { episodes: 100, concurrency: 16 },
];

/** How one side did: wall time of the whole eval, and how many episodes it solved. */
export interface EvalOutcome {
  ms: number;
  solved: number;
}

/** An eval's episodes: every example task, repeated until there are `count`. */
export async function evalEpisodes(count: number): Promise<Task[]> {
  const tasks = await loadTasks(EVAL_TASKS.map((path) => resolve(path)));
  return Array.from({ length: count }, (_, i) => tasks[i % tasks.length]!);
}

/** The oracle over the episodes through sandgym's own runner, as `sandgym eval` runs them. */
export async function sandgymEval(
  platform: LocalPlatform,
  episodes: Task[],
  concurrency: number,
): Promise<EvalOutcome> {
  const oracle = BUILT_IN_AGENTS['oracle']!;
  // each environment built once beforehand, as the Docker side's images are
  await new RolloutRunner(platform, oracle, { concurrency }).run(distinct(episodes));
  const started = performance.now();
  const reports = await new RolloutRunner(platform, oracle, { concurrency }).run(episodes);
  return {
    ms: performance.now() - started,
    solved: reports.filter((r) => r.outcome.kind === 'ok' && r.reward >= 1).length,
  };
}

function distinct(episodes: Task[]): Task[] {
  return [...new Map(episodes.map((task) => [task.source, task])).values()];
}

/** A folder's contents as a tarball under `name/`. */
async function tarOf(dir: string, name: string, scratch: string): Promise<Buffer> {
  const file = join(scratch, `${name}-${Math.random().toString(36).slice(2)}.tar`);
  await runProgram('tar', ['-C', dir, '--transform', `s,^\\.,${name},`, '-cf', file, '.']);
  return readFile(file);
}

/**
 * The base images the example Dockerfiles name, imported into an engine from the root file
 * systems sandgym resolves them to (no registry is reachable here): both sides start from the
 * same bytes.
 */
async function importBases(
  engine: PeerEngine,
  platform: LocalPlatform,
  episodes: Task[],
  scratch: string,
): Promise<void> {
  const bases = new Set<string>();
  for (const task of distinct(episodes)) {
    if (task.environment.kind !== 'dockerfile') continue;
    const from = /^FROM\s+(\S+)/im.exec(await readFile(task.environment.dockerfile, 'utf8'))?.[1];
    if (from) bases.add(from);
  }
  for (const [i, ref] of [...bases].entries()) {
    const { environment } = await platform.resolveImage(ref);
    const [name = ref, tag = 'latest'] = ref.split(':');
    // named in full: Podman would otherwise try a registry for a short name before its own store
    const repo = name.includes('/') ? name : `docker.io/library/${name}`;
    const tar = await platform.withLayerStack(environment.layers, (root) => tarOf(root, '.', scratch));
    // imported untagged, then tagged: Podman's import names every image `latest`
    const imported = `sandgym-bench/base-${i}`;
    await engine.api.importImage(tar, imported, 'latest');
    await engine.api.call('POST', `/images/${imported}:latest/tag?repo=${repo}&tag=${tag}`);
  }
}

/** One episode the way a Docker-based harness runs it: container, solution, tests, reward, removal. */
async function engineEpisode(
  engine: PeerEngine,
  image: string,
  task: Task,
  tars: { solution: Buffer; tests: Buffer },
): Promise<boolean> {
  const id = await engine.api.run(image, { memoryMib: task.resources.memoryMib, cpus: task.resources.cpu });
  try {
    await engine.api.putArchive(id, '/', tars.solution);
    await engine.api.exec(id, ['bash', '/solution/solve.sh']);
    await engine.api.putArchive(id, '/', tars.tests);
    await engine.api.exec(id, ['bash', '-c', 'mkdir -p /logs/verifier && bash /tests/test.sh']);
    return (await engine.api.exec(id, ['grep', '-qx', '1', '/logs/verifier/reward.txt'])) === 0;
  } finally {
    await engine.api.remove(id);
  }
}

/**
 * The same episodes through a container engine, as a Docker-based harness (Harbor's, say) runs
 * them: each task's image built once beforehand from the same base root file system, then every
 * episode at the same concurrency as sandgym's.
 */
export async function engineEval(
  engine: PeerEngine,
  platform: LocalPlatform,
  episodes: Task[],
  concurrency: number,
): Promise<EvalOutcome> {
  const scratch = await mkdtemp(join(platform.dataDir, 'peer-eval-'));
  try {
    await importBases(engine, platform, episodes, scratch);
    const prepared = new Map<string, { image: string; solution: Buffer; tests: Buffer }>();
    for (const [i, task] of distinct(episodes).entries()) {
      if (
        task.environment.kind !== 'dockerfile' ||
        task.oracle?.kind !== 'script' ||
        task.grading.kind !== 'reward_file'
      ) {
        throw new Error(`peers: task ${task.id} is not in Harbor's layout, which the Docker harness runs`);
      }
      const image = `sandgym-bench/task-${i}:latest`;
      const context = await tarOf(task.environment.context, '.', scratch);
      await engine.api.build(context, image, relative(task.environment.context, task.environment.dockerfile));
      prepared.set(task.source, {
        image,
        solution: await tarOf(task.oracle.dir, 'solution', scratch),
        tests: await tarOf(task.grading.testsDir, 'tests', scratch),
      });
    }
    const started = performance.now();
    const solved = await atATime(episodes.length, concurrency, (i) => {
      const task = episodes[i]!;
      const { image, ...tars } = prepared.get(task.source)!;
      return engineEpisode(engine, image, task, tars);
    });
    return { ms: performance.now() - started, solved: solved.filter(Boolean).length };
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}
