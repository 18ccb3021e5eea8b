import { SandgymError, isSandgymError, messageOf, type Redactor } from '../common/index.ts';
import {
  TaskEnv,
  TaskError,
  overheadMs,
  stepActionOf,
  type SandboxAction,
  type Grade,
  type ResetResult,
  type TaskResetInfo,
  type TaskStepInfo,
  type StepOutcome,
  type StepResult,
  type Task,
  type TaskObservation,
} from '../env/index.ts';
import { hostPlatformOf, type PlatformClient } from '../platform/index.ts';
import { AgentError, decisionOf, type Agent, type AgentDecision } from './agents.ts';
import type { EvalJournal, StartedEpisode } from './eval-journal.ts';
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
  /**
   * The training run every episode's sandboxes join (start it with `platform.startRun` or a
   * `TrainingCoordinator`): its phases pause, hibernate and resume them, and its end removes them.
   */
  run?: string;
  /**
   * The longest one decision of the agent may take; past it the episode ends, scored 0 with
   * `agentFailure`, so an agent that never answers cannot hang the eval. Default 30 minutes,
   * above a model agent's own request limits and retries.
   */
  decisionTimeoutMs?: number;
  /**
   * Removes secrets (an API key) from every step and report before anyone sees them: callbacks,
   * the journal, the results. An agent's own redactor (see {@link Agent}) is applied as well.
   */
  redactor?: Redactor;
}

const DEFAULT_DECISION_TIMEOUT_MS = 30 * 60_000;

/** What the agent answers for one step, within `timeoutMs`: else the agent's failure. */
async function decide(
  agent: Agent,
  observation: TaskObservation,
  context: Parameters<Agent>[1],
  timeoutMs: number,
): Promise<AgentDecision> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, fail) => {
    timer = setTimeout(
      () => fail(new AgentError(`The agent did not decide within ${timeoutMs} ms (decisionTimeoutMs)`)),
      // past 2^31 - 1 ms a timer fires at once
      Math.min(timeoutMs, 2 ** 31 - 1),
    );
  });
  try {
    const answer = Promise.resolve().then(() => agent(observation, context));
    return decisionOf(await Promise.race([answer, late]));
  } catch (error) {
    // the platform's or the endpoint's errors keep their kind; anything else an agent throws, or an
    // answer that cannot even be awaited (a revoked proxy, a `then` that throws), is its failure
    if (error instanceof SandgymError) throw error;
    throw new AgentError(`The agent failed to decide: ${messageOf(error)}`, { cause: error });
  } finally {
    clearTimeout(timer);
  }
}

/** Every redactor that applies to an episode, as one. */
function redactorOf(agent: Agent, options: EvaluateOptions): <T>(value: T) => T {
  const redactors = [options.redactor, agent.redactor].filter((r): r is Redactor => !!r);
  return <T>(value: T): T => redactors.reduce((out, redactor) => redactor.value(out), value);
}

/**
 * Takes over an episode an interrupted run started, if its sandbox is still alive on this node
 * (a durable platform adopted it): the agent starts over, and its steps replay from the
 * trajectory log until they pass its tail. Undefined when there is nothing to take over, or
 * when the task's services (which went with the interrupted run) would be missing.
 */
async function takeOver(
  platform: PlatformClient,
  env: TaskEnv,
  task: Task,
  earlier: StartedEpisode,
): Promise<ResetResult<TaskObservation, TaskResetInfo> | undefined> {
  const sandbox = await platform.attachSandbox(earlier.sandboxId).catch(() => undefined);
  if (!sandbox) return undefined;
  if (task.services?.length) {
    // its services and their network went with the run that started them: the episode starts over
    await sandbox.close();
    return undefined;
  }
  const records = await (await platform.stepLog(sandbox.id)).records();
  const used = records
    .filter((record) => record.episodeId === earlier.episodeId)
    .reduce((sum, record) => sum + record.durationMs, 0);
  return env.attach(sandbox, earlier.episodeId, Math.max(0, task.agentTimeoutMs - used));
}

/** Thrown when a taken-over episode cannot go on: its agent chose otherwise, or a step is in doubt. */
class TakeOverDiverged extends Error {}

/** What one episode runs with. */
interface EpisodeInputs {
  platform: PlatformClient;
  task: Task;
  agent: Agent;
  maxSteps: number;
  options: EvaluateOptions;
  /** The episode an interrupted run started, to take over. */
  earlier: StartedEpisode | undefined;
}

/** Plays one episode in an env of its own, and closes it before its timings are read. */
async function runEpisode(inputs: EpisodeInputs): Promise<EpisodeReport> {
  const { platform, task, options } = inputs;
  const env = TaskEnv.create(platform, task, options.run ? { run: options.run } : {});
  let report: EpisodeReport;
  try {
    report = await playEpisode(env, inputs);
  } finally {
    await env.close();
  }
  // after the teardown, so the episode's timings hold it
  const timings = env.timings;
  return { ...report, timings, overheadMs: Math.round(overheadMs(timings) * 10) / 10 };
}

async function playEpisode(
  env: TaskEnv,
  { platform, task, agent, maxSteps, options, earlier }: EpisodeInputs,
): Promise<EpisodeReport> {
  const started = performance.now();
  const redact = redactorOf(agent, options);
  const takenOver = earlier ? await takeOver(platform, env, task, earlier) : undefined;
  const opened = takenOver ?? (await env.reset());
  // a taken-over episode's sandbox has its solution from the run that started it
  if (agent.isOracle && !takenOver) await env.stageSolution();
  let observation = opened.observation;
  const { episodeId, sandboxId, notes: buildNotes } = opened.info;
  let timeout: { budgetMs: number } | undefined;
  const trajectory: StepEvent[] = [];
  if (!takenOver) await options.journal?.recordStart({ task: task.id, sandboxId, episodeId });
  let replayedSteps = 0;
  options.onLifecycle?.({ task: task.id, sandboxId, state: 'running' });
  const report = (
    steps: number,
    reward: number,
    outcome: StepOutcome,
    grade: Partial<Pick<Grade, 'tampered' | 'deniedEgress' | 'details'>> | undefined,
  ): EpisodeReport =>
    redact({
      task: task.id,
      reward,
      outcome,
      steps,
      durationMs: performance.now() - started,
      tampered: grade?.tampered ?? [],
      ...(grade?.deniedEgress ? { deniedEgress: grade.deniedEgress } : {}),
      ...(grade?.details ? { details: grade.details } : {}),
      ...(buildNotes.length ? { buildNotes } : {}),
      sandboxId,
      episodeId,
      ...(takenOver ? { replayedSteps } : {}),
      // the agent ran out its time budget: scored as it stands, never masked as infrastructure
      ...(timeout ? { timeout } : {}),
      trajectory,
    });
  try {
    for (let stepIndex = 0; stepIndex < maxSteps; stepIndex++) {
      let decision: AgentDecision;
      const deciding = performance.now();
      try {
        decision = await env.clock.time('agent', () =>
          decide(
            agent,
            observation,
            { task, episodeId, stepIndex },
            options.decisionTimeoutMs ?? DEFAULT_DECISION_TIMEOUT_MS,
          ),
        );
      } catch (error) {
        if (!(error instanceof AgentError)) throw error;
        // the policy failed to decide: its failure, scored, never masked as the platform's
        return { ...report(stepIndex, 0, { kind: 'ok' }, undefined), agentFailure: error.message };
      }
      // what the step carries and the trajectory keeps: the action, or an invalid one's record
      const action = stepActionOf(decision.action);
      const agentMs = performance.now() - deciding;
      const stepStarted = performance.now();
      let result: StepResult<TaskObservation, TaskStepInfo>;
      try {
        result = await env.step(action as SandboxAction);
      } catch (error) {
        // the agent chose differently this time, or the interrupted run died in the middle of a
        // step (which may or may not have taken effect): the episode cannot go on from its log
        if (takenOver && isSandgymError(error, 'divergence', 'step_in_doubt'))
          throw new TakeOverDiverged(messageOf(error));
        throw error;
      }
      const { info } = result;
      if (info.replayed) replayedSteps++;
      // what the sandbox printed may hold a secret too (a key the model pieced together there)
      const event: StepEvent = redact({
        task: task.id,
        episodeId,
        stepIndex,
        action,
        observation: result.observation,
        reward: result.reward,
        outcome: result.outcome,
        ...(info.signals ? { signals: info.signals } : {}),
        replayed: info.replayed,
        ...(info.startedAt ? { startedAt: info.startedAt } : {}),
        durationMs: performance.now() - stepStarted,
        ...(info.durationMs === undefined ? {} : { platformMs: info.durationMs }),
        agentMs,
        ...(decision.usage ? { usage: decision.usage } : {}),
        ...(decision.message ? { agentMessage: decision.message } : {}),
        ...(decision.turns ? { turns: decision.turns } : {}),
        ...(decision.callId === undefined ? {} : { callId: decision.callId }),
      });
      trajectory.push(event);
      options.onStep?.(event);
      observation = result.observation;
      timeout = info.timeout;
      if (result.outcome.kind !== 'ok' || result.terminated || result.truncated) {
        return report(stepIndex + 1, result.reward, result.outcome, info.grade);
      }
    }
    // ran out of steps: grade what is there, as a truncation
    const grade = await env.grade();
    return report(maxSteps, grade.reward, { kind: 'ok' }, grade);
  } finally {
    options.onLifecycle?.({ task: task.id, sandboxId, state: 'stopped' });
  }
}

/**
 * Sizes the embedded platform's warm pool to the batch: an episode holds its agent's sandbox and,
 * while it is graded, a grader's. The pool fills behind the first episodes and from the shells
 * finished ones leave, so a batch of one pays nothing for it. A training run's sandboxes take no
 * pooled shells (they hibernate through CRIU), so a run sizes none.
 */
function warmPoolFor(platform: PlatformClient, options: EvaluateOptions): void {
  if (options.run) return;
  hostPlatformOf(platform)?.warmPool.grow({ latency: 2 * Math.max(1, options.concurrency) });
}

/**
 * Refuses two tasks with one id: results, the journal and resumes are keyed by id, so the second
 * would take the first's result. The same task given again is another attempt at it (as Harbor's
 * `n_attempts` runs), each reported in its place; only a journal, which keeps one result per id,
 * cannot hold them.
 */
function refuseDuplicateIds(tasks: readonly Task[], journaled: boolean): void {
  const seen = new Map<string, Task>();
  for (const task of tasks) {
    const first = seen.get(task.id);
    if (first && (first !== task || journaled))
      throw new SandgymError(
        'invalid_argument',
        first === task
          ? `Task "${task.id}" is given more than once, and a journal keeps one result per task: run its attempts without a journal (no --run)`
          : `Two tasks have the id "${task.id}": ${first.source} and ${task.source}; give each task its own id`,
      );
    seen.set(task.id, task);
  }
}

/**
 * Runs one episode per task with at most `concurrency` at once, refilling as each finishes. An
 * episode that throws is reported with a `task_error` outcome when the task cannot run as written,
 * else an `infra_failure`: never as a reward of 0. What the policy gets wrong is scored: an
 * invalid action is an observation of its step, and an agent that fails to decide
 * ({@link AgentError}) ends its episode with reward 0 and `agentFailure`.
 *
 * @example
 * ```ts
 * const reports = await evaluate(platform, await loadTasks(['examples/tasks']), nopAgent, {
 *   concurrency: 2,
 * });
 * ```
 */
export async function evaluate(
  platform: PlatformClient,
  tasks: Task[],
  makeAgent: () => Agent,
  options: EvaluateOptions,
): Promise<EpisodeReport[]> {
  refuseDuplicateIds(tasks, options.journal !== undefined);
  warmPoolFor(platform, options);
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
      const maxSteps = options.maxSteps ?? 50;
      try {
        report =
          earlier ??
          (await runEpisode({
            platform,
            task,
            agent: makeAgent(),
            maxSteps,
            options,
            earlier: options.journal?.startedEpisode(task.id),
          }).catch((error: unknown) => {
            // the taken-over episode cannot go on from its log: it starts over in a fresh sandbox
            if (error instanceof TakeOverDiverged)
              return runEpisode({
                platform,
                task,
                agent: makeAgent(),
                maxSteps,
                options,
                earlier: undefined,
              });
            throw error;
          }));
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        report = {
          task: task.id,
          reward: 0,
          // a task that cannot run as written is its author's to fix; anything else, the platform's
          outcome:
            error instanceof TaskError
              ? { kind: 'task_error', message }
              : { kind: 'infra_failure', reason: 'platform_error', message },
          steps: 0,
          durationMs: 0,
          tampered: [],
          error: message,
        };
      }
      // a journal that cannot be written (a full disk) costs the resume, never this result
      if (!earlier && report.outcome.kind === 'ok')
        await options.journal?.record(report).catch(() => undefined);
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
