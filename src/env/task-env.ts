import { SandgymError, isSandgymError, messageOf } from '../common/index.ts';
import {
  LocalPlatform,
  type Environment as LayerEnvironment,
  type PlatformClient,
  type Sandbox,
} from '../platform/index.ts';
import type { EnvCallOptions, Environment, ResetOptions, ResetResult, StepResult } from './environment.ts';
import type { SandboxAction, SandboxObservation } from './sandbox-actions.ts';
import { SandboxEnv } from './sandbox-env.ts';
import type { Task } from './tasks/task.ts';
import { defaultVerifier, runVerifiers, type Verifier } from './verifiers.ts';
import { workspaceEnvironment, workspaceEnvironmentName } from './tasks/workspace.ts';

/**
 * Paths the grader takes from the task's own layers, never from the agent's diff; an agent's
 * edit to any of them is a tamper signal. Beyond the tests, solution and reward path, this is
 * everything the verifier runs with: interpreters and libraries (a replaced /bin/bash or a
 * /usr/local/bin/python3 first on PATH would forge a pass), and the dynamic loader's config.
 */
const PROTECTED = [
  'tests',
  'solution',
  'logs/verifier',
  'bin',
  'sbin',
  'lib',
  'lib32',
  'lib64',
  'libx32',
  'usr/bin',
  'usr/sbin',
  'usr/lib',
  'usr/lib32',
  'usr/lib64',
  'usr/libexec',
  'usr/local/bin',
  'usr/local/sbin',
  'etc/ld.so.preload',
  'etc/ld.so.conf',
  'etc/ld.so.conf.d',
  'etc/ld.so.cache',
];
/** The same, as the sandbox sees them: what each step's audit watches. */
export const PROTECTED_PATHS = PROTECTED.map((path) => `/${path}`);
/** Python start-up hooks that run before any test: left out of the graded diff wherever they are. */
const PROTECTED_PATTERNS = [
  '(^|/)(sitecustomize|usercustomize)\\.py$',
  '(^|/)site-packages/[^/]*\\.pth$',
  '(^|/)dist-packages/[^/]*\\.pth$',
];
/** Where a task's environment starts when its Dockerfile names an image we do not have. */
const FALLBACK_BASE = 'debian:bookworm';

/** How long a task's setup script may run. */
const SETUP_SCRIPT_TIMEOUT_MS = 10 * 60_000;

/** The name a task's Dockerfile build is stored under. */
function taskEnvironmentName(task: Task): string {
  return `task-${task.id.toLowerCase().replace(/[^a-z0-9._-]/g, '-')}:latest`;
}

/** What the agent is shown at reset: the instruction, and where it is. */
export type TaskObservation = SandboxObservation | { type: 'task'; instruction: string; sandboxId: string };

/** A task episode's saved state, for {@link TaskEnv.restore}. */
export interface TaskCheckpoint {
  /** The stored environment that holds it: the task's layers plus the agent's work so far. */
  environment: string;
  episodeId: string;
  stepIndex: number;
  /** Protected paths the agent had touched by then (left out of the checkpoint, reported at grading). */
  tampered: string[];
  /** What was left of the agent's time budget. */
  budgetLeftMs: number;
  /** Files only: processes and memory are not kept by container checkpoints. */
  depth: 'disk';
}

/** The result of grading one episode. */
export interface Grade {
  reward: number;
  /** Protected paths the agent's diff touched. */
  tampered: string[];
  /** Attempts of the agent's sandbox to reach addresses its network policy denies. */
  deniedEgress: number;
  /** What the verifiers reported. */
  details: Record<string, unknown>;
}

/** Options for {@link TaskEnv.create}. */
export interface TaskEnvOptions {
  /** Interceptors run before the task's own verifier: they may decide, or adjust its verdict. */
  verifiers?: Verifier[];
}

/**
 * A task as a gym environment. Reset starts the task's environment; steps are SandboxEnv
 * actions; submit, or the agent's time budget running out, ends the episode and grades it in a
 * fresh sandbox: the task's layers plus the agent's diff, protected paths restored, tests staged
 * there only, the reward file created empty just before the run and read over the agent channel.
 */
export class TaskEnv implements Environment<SandboxAction, TaskObservation> {
  private inner: SandboxEnv | undefined;
  private built: LayerEnvironment | undefined;
  private buildNotes: string[] = [];
  private deadline = 0;
  private isClosed = false;
  /** What the agent's sandbox started from when that was a checkpoint, not the task's environment. */
  private base: string | undefined;
  /** Tamper signals carried over from checkpoints. */
  private earlierTampering: string[] = [];
  private checkpoints = 0;

  private constructor(
    private readonly platform: PlatformClient,
    readonly task: Task,
    private readonly options: TaskEnvOptions,
  ) {}

  static create(platform: PlatformClient, task: Task, options: TaskEnvOptions = {}): TaskEnv {
    return new TaskEnv(platform, task, options);
  }

  /**
   * The task's environment: stored, or built here from its Dockerfile or git workspace (cached
   * step by step). A cluster client does not build; it uses what a node built under the same name.
   */
  async prepare(): Promise<LayerEnvironment> {
    if (this.built) return this.built;
    const source = this.task.environment;
    if (source.kind === 'stored') return (this.built = await this.platform.getEnvironment(source.ref));
    const platform = this.platform;
    if (!(platform instanceof LocalPlatform)) return (this.built = await this.prebuilt());
    if (source.kind === 'workspace')
      return (this.built = await workspaceEnvironment(platform, this.task.id, source));
    const result = await platform.buildFromDockerfile({
      file: source.dockerfile,
      context: source.context,
      name: taskEnvironmentName(this.task),
      fromFallback: FALLBACK_BASE,
    });
    this.built = result.environment;
    this.buildNotes = result.notes;
    return result.environment;
  }

  /** On a cluster: the environment this task's build leaves in the shared store. */
  private async prebuilt(): Promise<LayerEnvironment> {
    const source = this.task.environment;
    const ref =
      source.kind === 'workspace'
        ? workspaceEnvironmentName(this.task.id, source)
        : taskEnvironmentName(this.task);
    try {
      return await this.platform.getEnvironment(ref);
    } catch (error) {
      if (!isSandgymError(error, 'not_found')) throw error;
      throw new SandgymError(
        'failed_precondition',
        `Task ${this.task.id} needs environment ${ref}, which a cluster client cannot build: run \`sandgym eval\` or \`sandgym check\` on the task once on a node that shares the store`,
        { cause: error },
      );
    }
  }

  /** The live agent sandbox, once reset. */
  get sandbox(): Sandbox | undefined {
    return this.inner?.current;
  }

  async reset(options: ResetOptions = {}): Promise<ResetResult<TaskObservation>> {
    const environment = await this.prepare();
    this.base = undefined;
    this.earlierTampering = [];
    return this.start(`${environment.name}:${environment.version}`, this.task.agentTimeoutMs, options);
  }

  /** Starts the agent's sandbox from a stored environment, with `budgetMs` of agent time. */
  private async start(
    environment: string,
    budgetMs: number,
    options: ResetOptions,
  ): Promise<ResetResult<TaskObservation>> {
    if (this.isClosed)
      throw new SandgymError('failed_precondition', 'Cannot reset: the environment is closed');
    await this.inner?.close();
    this.inner = SandboxEnv.create(this.platform, {
      sandbox: {
        environment,
        resources: { cpu: this.task.resources.cpu, memoryMib: this.task.resources.memoryMib },
        env: this.task.env,
        network: this.task.network.setup,
      },
      protectedPaths: PROTECTED_PATHS,
    });
    const reset = await this.inner.reset(options);
    const sandbox = this.inner.current!;
    await sandbox.exec(['mkdir', '-p', '/logs/agent', '/logs/artifacts']);
    if (this.task.setupScript !== undefined) await this.runSetupScript(sandbox, this.task.setupScript);
    // the stage boundary: the same sandbox, the agent stage's rules
    await sandbox.setNetwork(this.task.network.agent);
    this.deadline = Date.now() + budgetMs;
    return this.opening(sandbox, reset.info);
  }

  private async runSetupScript(sandbox: Sandbox, script: string): Promise<void> {
    const result = await sandbox.exec(['sh', '-c', script], { timeoutMs: SETUP_SCRIPT_TIMEOUT_MS });
    if (result.exitCode === 0) return;
    const tail = (result.stderr || result.stdout).trim().split('\n').slice(-3).join(' | ');
    throw new SandgymError(
      'failed_precondition',
      `Task ${this.task.id}: its setup script failed (${result.timedOut ? 'timed out' : `exit ${result.exitCode}`}): ${tail || 'no output'}`,
    );
  }

  private opening(sandbox: Sandbox, info: Record<string, unknown>): ResetResult<TaskObservation> {
    return {
      observation: { type: 'task', instruction: this.task.instruction, sandboxId: sandbox.id },
      info: {
        ...info,
        task: this.task.id,
        agentTimeoutMs: this.task.agentTimeoutMs,
        network: { stage: 'agent', rules: this.task.network.agent },
        notes: this.buildNotes,
      },
    };
  }

  /**
   * Takes over an episode whose sandbox outlived the client that ran it (an eval that was
   * killed): its logged steps replay from the trajectory log as the agent re-issues them, and
   * the first step past the log runs for real. `budgetLeftMs` is the agent time still left.
   */
  async attach(
    sandbox: Sandbox,
    episodeId: string,
    budgetLeftMs: number,
  ): Promise<ResetResult<TaskObservation>> {
    if (this.isClosed)
      throw new SandgymError('failed_precondition', 'Cannot attach: the environment is closed');
    await this.prepare();
    await this.inner?.close();
    this.inner = await SandboxEnv.attach(this.platform, sandbox, episodeId, {
      owned: true,
      protectedPaths: PROTECTED_PATHS,
    });
    this.deadline = Date.now() + Math.floor(budgetLeftMs);
    return this.opening(sandbox, { episodeId, sandboxId: sandbox.id, attached: true });
  }

  /**
   * Saves the episode so far: the agent's changes, minus protected paths (reported as tampering
   * when graded), become a layer over the task's, stored as an environment.
   */
  async checkpoint(): Promise<TaskCheckpoint> {
    const agent = this.inner?.current;
    const environment = this.built;
    if (!agent || !environment || !this.inner)
      throw new SandgymError('failed_precondition', 'Nothing to checkpoint: call reset() first');
    const name = `ckpt-${this.task.id.toLowerCase().replace(/[^a-z0-9._-]/g, '-')}`.slice(0, 64);
    const version = `${this.inner.episode}-${++this.checkpoints}`.slice(0, 64);
    // the agent's own stack (the task's layers, or an earlier checkpoint's) plus its filtered diff
    const { present } = await this.platform.packDiff(agent, {
      ...this.diffOptions(),
      name: `${name}:${version}`,
      description: `checkpoint ${this.checkpoints} of ${this.task.id}, episode ${this.inner.episode}`,
    });
    const tampered = present.map((path) => `/${path}`);
    return {
      environment: `${name}:${version}`,
      episodeId: this.inner.episode,
      stepIndex: this.inner.nextStepIndex,
      tampered: [...new Set([...this.earlierTampering, ...tampered])],
      budgetLeftMs: Math.max(0, this.deadline - Date.now()),
      depth: 'disk',
    };
  }

  /** Starts a new sandbox from a checkpoint; the episode goes on from there as a new branch. */
  async restore(checkpoint: TaskCheckpoint): Promise<ResetResult<TaskObservation>> {
    await this.prepare();
    const restored = await this.start(checkpoint.environment, checkpoint.budgetLeftMs, {
      options: { episodeId: `${checkpoint.episodeId}@${checkpoint.environment}` },
    });
    this.base = checkpoint.environment;
    this.earlierTampering = checkpoint.tampered;
    return { ...restored, info: { ...restored.info, restoredFrom: checkpoint } };
  }

  async step(action: SandboxAction, options: EnvCallOptions = {}): Promise<StepResult<TaskObservation>> {
    const inner = this.inner;
    if (!inner) throw new SandgymError('failed_precondition', 'Call reset() before step()');
    const left = this.deadline - Date.now();
    const outOfTime = left <= 0;

    const result: StepResult<TaskObservation> = outOfTime
      ? {
          observation: { type: 'submitted' },
          reward: 0,
          terminated: false,
          truncated: true,
          info: {},
          outcome: { kind: 'ok' },
        }
      : await inner.step(action, { ...options, commandTimeoutCapMs: left });
    if (result.outcome.kind !== 'ok' || !(result.terminated || result.truncated)) return result;
    try {
      const grade = await this.grade();
      return {
        ...result,
        reward: grade.reward,
        info: {
          ...result.info,
          grade,
          ...(outOfTime ? { timeout: { budgetMs: this.task.agentTimeoutMs } } : {}),
        },
      };
    } catch (error) {
      return { ...result, reward: 0, outcome: { kind: 'verifier_error', message: messageOf(error) } };
    }
  }

  /** Grades the episode so far in a fresh sandbox; the agent's sandbox is frozen while its diff is taken. */
  async grade(): Promise<Grade> {
    const agent = this.inner?.current;
    const environment = this.built;
    if (!agent || !environment)
      throw new SandgymError('failed_precondition', 'Nothing to grade: call reset() first');
    // no name: a layer for this grading only, which layer gc reclaims later
    const { layer, present } = await this.platform.packDiff(agent, this.diffOptions());
    const { deniedEgress } = await agent.stats();
    const tampered = [...new Set([...this.earlierTampering, ...present.map((path) => `/${path}`)])];
    const clean = this.base ?? `${environment.name}:${environment.version}`;
    const grader = await this.platform.createSandbox({
      environment: clean,
      extraLayers: [layer.digest],
      resources: { cpu: this.task.resources.cpu, memoryMib: this.task.resources.memoryMib },
      network: this.task.network.verify,
    });
    try {
      const verdict = await runVerifiers([...(this.options.verifiers ?? []), defaultVerifier(this.task)], {
        task: this.task,
        grader,
        workdir: environment.config.workdir,
        platform: this.platform,
        environment: clean,
      });
      // Tampering is reported, not punished: the protected paths came from the task's own
      // layers, so the verifier judged the real work.
      return { reward: verdict.reward, tampered, deniedEgress, details: verdict.details };
    } finally {
      await grader.close();
    }
  }

  /** The agent's changes without the protected paths, reporting which of those it touched. */
  private diffOptions(): { excludePaths: string[]; excludeRegexes: string[]; reportPaths: string[] } {
    return { excludePaths: PROTECTED, excludeRegexes: PROTECTED_PATTERNS, reportPaths: PROTECTED };
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    await this.inner?.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
