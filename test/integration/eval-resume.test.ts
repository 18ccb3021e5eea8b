import { spawn, spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { cp, readFile, readdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backends/index.ts';
import { createMsgpackCodec } from '../../src/common/index.ts';
import { TrajectoryLog } from '../../src/platform/index.ts';
import { COUNTED_STEPS, SLOW_STEP } from '../../examples/agents/slow-hello.ts';
import { createTestPlatform } from '../support/platform.ts';

const CLI = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');
const AGENT = join(packageRoot(), 'dist', 'examples', 'agents', 'slow-hello.js');
const TASK = resolve('examples/tasks/hello-file');

/**
 * Frames of the trajectory logs that another process is writing: step records, and the intents
 * of steps that started. Read, never opened for append.
 */
async function loggedFrames(dataDir: string): Promise<{ records: number; intents: number }> {
  const codec = createMsgpackCodec();
  const counts = { records: 0, intents: 0 };
  for (const name of await readdir(join(dataDir, 'trajectories')).catch(() => [] as string[])) {
    const bytes = await readFile(join(dataDir, 'trajectories', name));
    for (let offset = 0; offset + 8 <= bytes.length;) {
      const end = offset + 8 + bytes.readUInt32BE(offset);
      if (end > bytes.length) break;
      const frame = codec.decode(bytes.subarray(offset + 8, end)) as { intent?: boolean };
      if (frame.intent) counts.intents++;
      else counts.records++;
      offset = end;
    }
  }
  return counts;
}

/** What an eval that was killed and run again printed and reported. */
interface Rerun {
  second: SpawnSyncReturns<string>;
  episodes: { reward: number; replayedSteps?: number; sandboxId: string; episodeId: string }[];
  env: NodeJS.ProcessEnv;
}

/**
 * Runs `sandgym eval TASK` with the slow agent in `dataDir` until `killWhen` holds for its logs,
 * kills it hard, and runs the same eval again.
 */
async function killThenRerun(
  task: string,
  dataDir: string,
  killWhen: (frames: { records: number; intents: number }) => boolean,
  extraArgs: readonly string[] = [],
): Promise<Rerun> {
  const env = { ...process.env, SANDGYM_DATA_DIR: dataDir };
  const out = join(dataDir, 'report.json');
  const args = [CLI, 'eval', task, '--agent', AGENT, '--json', out, ...extraArgs];
  const first = spawn('node', args, { env, stdio: 'ignore' });
  const exited = new Promise((done) => first.once('exit', done));
  try {
    const deadline = Date.now() + 120_000;
    while (!killWhen(await loggedFrames(dataDir))) {
      if (Date.now() > deadline || first.exitCode !== null) throw new Error('the first eval never got going');
      await new Promise((done) => setTimeout(done, 50));
    }
  } finally {
    first.kill('SIGKILL');
    await exited;
  }
  const second = spawnSync('node', args, { env, encoding: 'utf8', timeout: 180_000 });
  expect(second.status, second.stderr).toBe(0);
  const report = JSON.parse(await readFile(out, 'utf8')) as { episodes: Rerun['episodes'] };
  return { second, episodes: report.episodes, env };
}

/**
 * The step that counts the lines saw one per counted step (none ran twice), and the rerun left no
 * sandbox behind.
 */
async function expectEachCountedStepOnce(
  dataDir: string,
  episode: Rerun['episodes'][number],
  env: NodeJS.ProcessEnv,
): Promise<void> {
  const log = await TrajectoryLog.open(
    join(dataDir, 'trajectories', `${episode.sandboxId}.log`),
    createMsgpackCodec(),
  );
  try {
    const counting = log.episode(episode.episodeId)[SLOW_STEP + 1];
    expect((counting?.result as { observation: { stdout: string } }).observation.stdout).toBe(
      `${COUNTED_STEPS}\n`,
    );
  } finally {
    await log.close();
  }
  expect(spawnSync('node', [CLI, 'ps', '--json'], { env, encoding: 'utf8' }).stdout).toBe(
    '{"sandboxes":[]}\n',
  );
}

describe('sandgym eval, killed and run again', () => {
  it('takes over the running episode of a killed eval in its run and fast-forwards it, each step once', async () => {
    await using test = await createTestPlatform('eval-resume', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
    // killed while the agent thinks between its counted steps: no step is running
    const { second, episodes, env } = await killThenRerun(
      TASK,
      test.dataDir,
      ({ records }) => records >= COUNTED_STEPS,
      ['--run', 'evals', '--lease', '20s'],
    );
    expect(second.stderr).toMatch(/1 running episodes fast-forward from their logs/);
    // the killed eval's sandbox joined the run, and the rerun rejoined it by name
    expect(second.stderr).toMatch(/in run evals \(phase rollout, 1 sandboxes\)/);
    const [episode] = episodes;
    expect(episode?.reward).toBe(1);
    expect(episode?.replayedSteps).toBeGreaterThanOrEqual(3);
    await expectEachCountedStepOnce(test.dataDir, episode!, env);
  });

  it('starts over an episode whose task has services, which went with the killed eval', async () => {
    await using test = await createTestPlatform('eval-resume-services', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
    // the hello task with a web service beside it
    const task = join(test.dataDir, 'hello-with-web');
    await cp(TASK, task, { recursive: true });
    await cp(
      resolve('test/fixtures/tasks/harbor/compose-main/environment/web'),
      join(task, 'environment', 'web'),
      {
        recursive: true,
      },
    );
    await writeFile(
      join(task, 'environment', 'docker-compose.yaml'),
      'services:\n  main:\n    build: .\n  web:\n    build:\n      context: ./web\n',
    );
    const { episodes, env } = await killThenRerun(
      task,
      test.dataDir,
      ({ records }) => records >= COUNTED_STEPS,
    );
    // a fresh episode with its services, not a take-over that would grade without them
    expect(episodes.map((e) => [e.reward, e.replayedSteps ?? 0])).toEqual([[1, 0]]);
    expect(spawnSync('node', [CLI, 'ps', '--json'], { env, encoding: 'utf8' }).stdout).toBe(
      '{"sandboxes":[]}\n',
    );
  });

  it('starts over an episode whose step was cut by the kill: that step is in doubt, never run again', async () => {
    await using test = await createTestPlatform('eval-resume-in-doubt', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
    // killed while the slow step's command runs: it started, and has no record
    const { episodes, env } = await killThenRerun(
      TASK,
      test.dataDir,
      ({ records, intents }) => records === SLOW_STEP && intents === SLOW_STEP + 1,
    );
    const [episode] = episodes;
    expect([episode?.reward, episode?.replayedSteps ?? 0]).toEqual([1, 0]);
    // the fresh episode counted its own steps from nothing
    await expectEachCountedStepOnce(test.dataDir, episode!, env);
  });
});
