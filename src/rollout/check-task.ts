import { TaskEnv, comparableObservation, oraclePlan, type SandboxAction, type Task } from '../env/index.ts';
import type { PlatformClient } from '../platform/index.ts';
import { decisionOf, nopAgent, oracleAgent, type Agent } from './agents.ts';

/** One check of the agentic environment checker. */
export interface CheckResult {
  name: string;
  passed: boolean;
  detail: string;
}

/** Every path of the sandbox root, then a checksum of each file (md5sum batched, not one per file). */
const TREE_SCRIPT = 'find / -xdev | sort; find / -xdev -type f -exec md5sum {} + | sort';

interface Episode {
  reward: number;
  actions: SandboxAction[];
  observations: string[];
}

async function play(env: TaskEnv, task: Task, agent: Agent, seed = 0): Promise<Episode> {
  const opened = await env.reset({ seed });
  if (agent.isOracle) await env.stageSolution();
  let observation = opened.observation;
  const episode: Episode = { reward: 0, actions: [], observations: [] };
  for (let stepIndex = 0; stepIndex < 50; stepIndex++) {
    const { action } = decisionOf(
      await agent(observation, { task, episodeId: opened.info.episodeId, stepIndex }),
    );
    const step = await env.step(action);
    episode.actions.push(action);
    episode.observations.push(comparableObservation(step.observation));
    observation = step.observation;
    if (step.outcome.kind !== 'ok')
      throw new Error(
        `episode ended with ${step.outcome.kind}: ${'message' in step.outcome ? step.outcome.message : ''}`,
      );
    if (step.terminated || step.truncated) {
      episode.reward = step.reward;
      break;
    }
  }
  return episode;
}

/**
 * The agentic environment checker (`sandgym check`; see docs/tasks.md), for one task: the oracle passes, a
 * do-nothing agent fails, nothing hidden is visible from the agent's sandbox, reset is
 * deterministic, replaying the oracle's actions reproduces its observations, and close() is
 * idempotent and leaves nothing behind.
 */
export async function checkTask(platform: PlatformClient, task: Task): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  const check = async (name: string, run: () => Promise<string>): Promise<void> => {
    try {
      results.push({ name, passed: true, detail: await run() });
    } catch (error) {
      results.push({ name, passed: false, detail: error instanceof Error ? error.message : String(error) });
    }
  };
  let oracleRun: Episode | undefined;
  await check('oracle passes', async () => {
    await using env = TaskEnv.create(platform, task);
    oracleRun = await play(env, task, oracleAgent());
    if (oracleRun.reward < 1) throw new Error(`the oracle got reward ${oracleRun.reward}`);
    return `reward ${oracleRun.reward}`;
  });
  await check('grading fits what the agent leaves running', () => gradedBothWays(platform, task));
  await check('do-nothing agent fails', async () => {
    await using env = TaskEnv.create(platform, task);
    const { reward } = await play(env, task, nopAgent());
    if (reward >= 1) throw new Error(`a do-nothing agent got reward ${reward}: the task is broken`);
    return `reward ${reward}`;
  });
  await check('nothing hidden is visible to the agent', async () => {
    await using env = TaskEnv.create(platform, task);
    await env.reset();
    const hidden = [...task.hiddenPaths, '/logs/verifier'];
    // each path is passed as an argument, never spliced into the shell line; an empty folder is
    // no leak: Dockerfiles `mkdir -p /tests` for the harness to copy into later
    const probe = await env.sandbox!.exec([
      'sh',
      '-c',
      'for p in "$@"; do if [ -d "$p" ] && [ ! -L "$p" ] && [ -z "$(ls -A "$p")" ]; then echo "empty $p"; elif [ -e "$p" ] || [ -L "$p" ]; then echo "seen $p"; fi; done; true',
      'probe',
      ...hidden,
    ]);
    const found = probe.stdout.split('\n').filter(Boolean);
    const seen = found.filter((line) => line.startsWith('seen ')).map((line) => line.slice(5));
    const empty = found.filter((line) => line.startsWith('empty ')).map((line) => line.slice(6));
    if (seen.length) throw new Error(`the agent can see ${seen.join(', ')}`);
    const emptyNote = empty.length ? ` (${empty.join(', ')}: empty folders the image made)` : '';
    return `nothing of ${hidden.join(', ')} in the agent sandbox${emptyNote}`;
  });
  await check('reset is deterministic', async () => {
    await using env = TaskEnv.create(platform, task);
    const trees: string[] = [];
    for (let i = 0; i < 2; i++) {
      await env.reset({ seed: 1 });
      trees.push(
        (await env.sandbox!.exec(['sh', '-c', TREE_SCRIPT], { outputCapBytes: 64 * 1024 * 1024 })).stdout,
      );
    }
    if (trees[0] !== trees[1]) throw new Error('two resets with the same seed gave different file trees');
    return `${trees[0]?.split('\n').length ?? 0} paths identical across two resets`;
  });
  await check('replay reproduces the trajectory', async () => {
    if (!oracleRun) throw new Error('no oracle trajectory to replay');
    const recorded = oracleRun;
    await using env = TaskEnv.create(platform, task);
    // the oracle's actions again, with its solution staged as it was
    const replayed: Agent = (_o, { stepIndex }) =>
      Promise.resolve(recorded.actions[stepIndex] ?? { type: 'submit' });
    const replay = await play(env, task, Object.assign(replayed, { isOracle: true }));
    const at = replay.observations.findIndex(
      (o, i) => JSON.stringify(o) !== JSON.stringify(recorded.observations[i]),
    );
    if (at >= 0) throw new Error(`step ${at} observed something else on replay`);
    if (replay.reward !== recorded.reward)
      throw new Error(`replay got reward ${replay.reward}, the recording ${recorded.reward}`);
    return `${replay.observations.length} observations and the reward match`;
  });
  await check('close is idempotent and leaves nothing', async () => {
    const env = TaskEnv.create(platform, task);
    await env.reset();
    const id = env.sandbox!.id;
    await env.close();
    await env.close();
    if ((await platform.listSandboxes()).some((s) => s.id === id))
      throw new Error(`sandbox ${id} is still there`);
    return 'closed twice; its sandbox is gone';
  });
  return results;
}

/** How each verifier mode is named in a task's own file, for a message. */
function modeKey(task: Task, mode: 'fresh' | 'shared'): string {
  if (task.format === 'terminal-bench') return `sandgym_verifier_mode: ${mode} (task.yaml)`;
  return `[verifier] environment_mode = "${mode === 'shared' ? 'shared' : 'separate'}" (task.toml)`;
}

/**
 * The oracle's work graded both ways, in a fresh grader and in its own sandbox: a task whose
 * result differs depends on processes the agent left running (a daemon, a tunnel), and its
 * verifier mode must say so; a task graded in place that passes fresh too is told it need not be.
 */
async function gradedBothWays(platform: PlatformClient, task: Task): Promise<string> {
  await using env = TaskEnv.create(platform, task);
  await env.reset();
  await env.stageSolution();
  for (const action of oraclePlan(task)) {
    const step = await env.step(action);
    if (step.outcome.kind !== 'ok') throw new Error(`the oracle's step ended with ${step.outcome.kind}`);
  }
  // a fresh grading leaves the sandbox as it was; grading in place ends the episode, so it goes last
  const fresh = await env.grade({ mode: 'fresh' });
  const shared = await env.grade({ mode: 'shared' });
  const mode = task.verifierMode ?? 'fresh';
  const left = (shared.details['leftoverProcesses'] as string[] | undefined) ?? [];
  const running = left.length ? `processes left running: ${left.join(', ')}` : 'no process was left running';
  if (fresh.reward >= 1 && shared.reward >= 1)
    return mode === 'shared'
      ? `the oracle passes in a fresh grader too: ${modeKey(task, 'fresh')} would keep what the agent leaves running away from the tests`
      : `the oracle passes in a fresh grader and in its own sandbox (${running})`;
  if (shared.reward >= 1) {
    if (mode === 'fresh')
      throw new Error(
        `the oracle passes only when graded in its own sandbox (reward ${fresh.reward} in a fresh grader): its tests check what it left running (${running}); set ${modeKey(task, 'shared')}`,
      );
    // the grade names the residual when the agent and the tests run as one user (root or not)
    const residual = shared.details['residual'];
    return `graded in the agent's sandbox, as the task asks (reward ${fresh.reward} in a fresh grader; ${running})${
      residual
        ? "; the agent runs as the tests' user, so a process it leaves can reach the tests and the reward while they run (docs/security.md): an agent user other than the tests' closes that"
        : ''
    }`;
  }
  if (fresh.reward >= 1)
    throw new Error(
      `the oracle passes in a fresh grader but gets ${shared.reward} graded in its own sandbox`,
    );
  throw new Error(
    `the oracle fails graded either way (fresh ${fresh.reward}, in its sandbox ${shared.reward})`,
  );
}
