import { spawn } from 'node:child_process';
import { closeSync, fdatasyncSync, openSync } from 'node:fs';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ChatEnv, SandboxEnv, type ResetOptions, type SandboxAction } from '../src/env/index.ts';
import { packageRoot } from '../src/backends/index.ts';
import { Platform, defaultDataDir, defaultStoreDir, type Sandbox } from '../src/platform/index.ts';
import { compared, hostInfo, quantile, type BenchOptions, type BenchReport } from './report.ts';

/** Rounds per condition; each round times this many of each kind, so drifting load hits all alike. */
const ROUNDS = 15;
const PER_ROUND = 20;
const WARMUP = 20;
const ACTION: SandboxAction = { type: 'exec', command: ['true'] };
/** The same step as a model's answer to a chat env: read, run, and told back as a tool message. */
const CHAT_ANSWER = 'Running it.\n<tool_call>{"name": "exec", "arguments": {"command": "true"}}</tool_call>';
/** What runs beside the loaded half: the oracle over two example tasks, as `sandgym eval` runs it. */
const LOAD_TASKS = ['examples/tasks/hello-file', 'examples/tasks/fix-sum'];

interface Samples {
  exec: number[];
  step: number[];
  /**
   * A step whose record is then synced to the disk before the caller goes on: what a step cost
   * when the log synced every record before answering (as it did before its barriers).
   */
  syncedStep: number[];
  /**
   * What a chat env's turn (see CHAT_ANSWER) adds to the step it runs: the turn's time less its
   * inner step's, so the step's own noise, far larger, does not drown it.
   */
  chatOverhead: number[];
}

/** A chat env over `env` that knows how long its last inner step took. */
function timedChat(env: SandboxEnv): { chat: ChatEnv; lastStepMs: () => number } {
  let last = 0;
  const timed = {
    reset: (options?: ResetOptions) => env.reset(options),
    step: async (action: SandboxAction) => {
      const started = performance.now();
      const result = await env.step(action);
      last = performance.now() - started;
      return result;
    },
    close: () => env.close(),
    [Symbol.asyncDispose]: () => env.close(),
  };
  return { chat: ChatEnv.create(timed), lastStepMs: () => last };
}

async function time(samples: number[], count: number, call: () => unknown): Promise<void> {
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    await call();
    samples.push(performance.now() - started);
  }
}

/** Rounds of execs, steps and synced steps, alternating, so the three see the same load. */
async function measure(
  sandbox: Sandbox,
  env: SandboxEnv,
  chat: ReturnType<typeof timedChat>,
  logPath: string,
): Promise<Samples> {
  const samples: Samples = { exec: [], step: [], syncedStep: [], chatOverhead: [] };
  const log = openSync(logPath, 'r');
  try {
    for (let round = 0; round < ROUNDS; round++) {
      await time(samples.exec, PER_ROUND, () => sandbox.exec(['true']));
      await time(samples.step, PER_ROUND, () => env.step(ACTION));
      for (let i = 0; i < PER_ROUND; i++) {
        const started = performance.now();
        await chat.chat.step(CHAT_ANSWER);
        samples.chatOverhead.push(performance.now() - started - chat.lastStepMs());
      }
      await time(samples.syncedStep, PER_ROUND, async () => {
        await env.step(ACTION);
        fdatasyncSync(log);
      });
    }
  } finally {
    closeSync(log);
  }
  return samples;
}

/** `sandgym eval` over the load tasks in a loop, in a process and data dir of its own, until stopped. */
function evalLoop(dir: string): { started: Promise<void>; stop: () => Promise<void> } {
  const stopFile = join(dir, 'stop');
  const cli = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');
  const tasks = LOAD_TASKS.map((task) => join(packageRoot(), task)).join(' ');
  // each eval ends by itself (killing one would leave its durable sandboxes behind)
  const script = `while [ ! -e ${stopFile} ]; do "${process.execPath}" ${cli} eval ${tasks} --concurrency 2 >/dev/null 2>&1; echo done; done`;
  const child = spawn('sh', ['-c', script], {
    env: { ...process.env, SANDGYM_DATA_DIR: join(dir, 'data') },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const started = new Promise<void>((done, fail) => {
    child.stdout.once('data', () => done());
    void exited.then(() => fail(new Error('the eval beside the steps stopped before its first round')));
  });
  return {
    started,
    stop: async () => {
      await writeFile(stopFile, '');
      await exited;
    },
  };
}

/**
 * step-load: an env step of `true` against the bare exec under it, on the embedded platform,
 * quiet and then with `sandgym eval` running beside it on the same cores, in one run; beside
 * them, a step whose log is then synced (what every step cost while the log synced each record
 * before answering), and the step as a chat env's turn. Goals: a step at most 2x its exec with
 * the eval beside it; a chat turn at most 0.2 ms over the step at p50.
 */
export async function benchStepLoad(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dir = resolve(base, `bench-step-load-${process.pid}`);
  await mkdir(dir, { recursive: true });
  const platform = await Platform.local({ dataDir: join(dir, 'platform'), storeDir: defaultStoreDir(base) });
  const results: { quiet?: Samples; loaded?: Samples } = {};
  try {
    await using env = SandboxEnv.create(platform, { sandbox: { environment: 'busybox:latest' } });
    // the chat env steps the same episode: its turns and the raw steps interleave
    const chat = timedChat(env);
    await chat.chat.reset();
    // the exec under the step: in the same sandbox
    const sandbox = env.current!;
    for (let i = 0; i < WARMUP; i++) {
      await sandbox.exec(['true']);
      await env.step(ACTION);
      await chat.chat.step(CHAT_ANSWER);
    }
    const logPath = join(dir, 'platform', 'trajectories', `${sandbox.id}.log`);
    options.progress(`step-load: quiet, ${ROUNDS * PER_ROUND} execs, steps and synced steps`);
    results.quiet = await measure(sandbox, env, chat, logPath);
    options.progress('step-load: starting `sandgym eval` beside the steps');
    const load = evalLoop(dir);
    try {
      await load.started;
      options.progress(`step-load: loaded, ${ROUNDS * PER_ROUND} execs, steps and synced steps`);
      results.loaded = await measure(sandbox, env, chat, logPath);
    } finally {
      options.progress('step-load: waiting for the eval beside the steps to end');
      await load.stop();
    }
  } finally {
    await platform.close();
    await rm(dir, { recursive: true, force: true });
  }
  const metrics: BenchReport['metrics'] = {};
  for (const [condition, samples] of Object.entries(results)) {
    for (const q of [0.5, 0.99]) {
      const at = (times: number[]): number => quantile(times, q);
      metrics[`${condition}_step_p${q * 100}_vs_exec`] = compared(at(samples.step), at(samples.exec));
      metrics[`${condition}_synced_step_p${q * 100}_vs_exec`] = compared(
        at(samples.syncedStep),
        at(samples.exec),
      );
      // what the chat env adds to a step (goal: at most 0.2 ms at p50)
      metrics[`${condition}_chat_overhead_p${q * 100}_vs_step`] = compared(
        at(samples.chatOverhead),
        at(samples.step),
      );
    }
  }
  return { bench: 'step-load', host: hostInfo(), metrics };
}
