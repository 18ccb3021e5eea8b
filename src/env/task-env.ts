import { createHash } from 'node:crypto';
import { SandgymError, isSandgymError, messageOf, type FailureReason } from '../common/index.ts';
import {
  hostPlatformOf,
  isDiffLargerThanDisk,
  type HostPlatform,
  type Environment as LayerEnvironment,
  type PlatformClient,
  type Sandbox,
} from '../platform/index.ts';
import type {
  EnvCallOptions,
  Environment,
  ResetInfo,
  ResetOptions,
  ResetResult,
  StepInfo,
  StepResult,
} from './environment.ts';
import type { SandboxAction, SandboxObservation, StepOutcome } from '../platform/index.ts';
import { oraclePlan } from './oracle-plan.ts';
import { SandboxEnv, type DiskCheckpointRef, type MemoryCheckpointRef } from './sandbox-env.ts';
import {
  TaskError,
  checkSharedGradingNetwork,
  checkTaskLimits,
  taskStorageStem,
  type Task,
  type TaskMcpServer,
  type VerifierMode,
} from './tasks/task.ts';
import { HARBOR_SOLUTION_DIR } from './tasks/harbor.ts';
import { stageFolder } from './stage-folder.ts';
import { Deadline } from './deadline.ts';
import {
  BASE_SCOPE,
  PROTECTED_PATHS,
  gradingScope,
  isHomeToolPath,
  startUpHooksIn,
  type GradingScope,
} from './grading-scope.ts';
import { probeInterpreters, type InterpreterFacts } from './python-probe.ts';
import {
  GradingAnomaly,
  defaultVerifier,
  runVerifiers,
  type Verifier,
  type VerifierResult,
} from './verifiers/index.ts';
import { workspaceEnvironment, workspaceEnvironmentName } from './tasks/workspace.ts';
import { TaskServices } from './task-services.ts';
import { startEntrypoint } from './entrypoint.ts';
import { waitHealthy } from './healthcheck.ts';
import { networkReport } from './network-report.ts';
import { PACK_REPORT_MAX_ENTRIES, recordText, type NetworkRecord } from '../backends/index.ts';
import { PhaseClock, type EpisodeTimings } from './episode-timings.ts';

/** How long a task's setup script may run. */
const SETUP_SCRIPT_TIMEOUT_MS = 10 * 60_000;

/** Grading's time beyond the tests' own budget: staging the tests, reading the reward. */
const GRADING_OVERHEAD_MS = 2 * 60_000;

/** Errors of grading that are the platform's, not the verifier's: an infrastructure outcome. */
const INFRA_CODES = ['node_lost', 'admission_rejected', 'platform_error'] as const;

/** The outcome of an episode whose grading threw `error`: the platform's failure, or the verifier's. */
export function gradingFailure(error: unknown): StepOutcome {
  const message = messageOf(error);
  return isSandgymError(error, ...INFRA_CODES)
    ? { kind: 'infra_failure', reason: error.code as FailureReason, message }
    : { kind: 'verifier_error', message };
}

/**
 * What probes of clean sandboxes found, per layer stack: environments are immutable, so one probe
 * serves every episode of every task on them in this process.
 */
const probed = new Map<string, Promise<InterpreterFacts>>();

/**
 * Whether a task's verifier passes its oracle, per loaded task (its tests and oracle are part of
 * it, not of its layers) and layer stack: asked only when grading fails alike with and without
 * the agent's changes, and the same in every episode of the task.
 */
const oracleVerdicts = new WeakMap<Task, Map<string, Promise<OracleVerdict>>>();

/** Whether the verifier passes the task's oracle, and if not, what the oracle's run said. */
interface OracleVerdict {
  passes: boolean;
  why: string;
}

/** The most entries each of the caches above keeps; the oldest go first. */
const CACHE_SIZE = 256;

/** `make()`'s promise for `key`, made once while it is cached; a rejected one is forgotten. */
function cachedPromise<T>(cache: Map<string, Promise<T>>, key: string, make: () => Promise<T>): Promise<T> {
  let value = cache.get(key);
  if (!value) {
    value = make();
    cache.set(key, value);
    value.catch(() => cache.delete(key));
    if (cache.size > CACHE_SIZE) cache.delete(cache.keys().next().value ?? key);
  }
  return value;
}

/**
 * Each task's built environment and build notes, per platform: a batch runs a task's episodes on
 * one Task object, and the build's cache lookup (hashing its context again) need not be repeated
 * for each. A failed build is not kept.
 */
const builds = new WeakMap<PlatformClient, WeakMap<Task, Promise<Built>>>();

/** A task's environment as built, and what building it noted. */
interface Built {
  environment: LayerEnvironment;
  notes: string[];
}

/** What a fresh grading's details say when the agent's sandbox still ran processes. */
const LEFTOVER_NOTE =
  'processes the agent left running are not in the fresh sandbox the tests ran in; a task whose tests check them needs `[verifier] environment_mode = "shared"` (sandgym check tells)';

/** How much of a failing verifier's output a `verifier_error`'s message carries. */
const LAST_WORDS_CHARS = 1500;

/** The end of what a verifier printed before an anomaly, for the message of a `verifier_error`. */
function lastWords(error: unknown): string {
  if (!(error instanceof GradingAnomaly) || !error.output) return '';
  const tail = `${error.output.stdoutTail}\n${error.output.stderrTail}`.trim().slice(-LAST_WORDS_CHARS);
  return tail ? `. Without the agent's changes, the verifier's output ended with:\n${tail}` : '';
}

/** An outcome in a few words, for a message. */
function outcomeText(reward: number, outcome: StepOutcome): string {
  if (outcome.kind === 'ok') return `reward ${reward}`;
  return `${outcome.kind}: ${outcome.message}`;
}

/**
 * The paths only graders write (the tests, the reward folder, sandgym's harness): in a shared
 * grading, whatever the agent left there is removed before the platform stages its own.
 */
const GRADER_OWNED_PATHS = ['/tests', '/logs/verifier', '/sandgym-runner'];

/**
 * Readies the agent's live sandbox for grading in place, as root: /logs made root's (so no
 * user can swap the verifier's folder beneath it), what the agent left at the graders' paths and
 * its start-up hooks (NUL-separated on its stdin) removed, and the tests' folders made anew, private to the
 * tests' user (`$TESTS_USER`), so a leftover process of any other user cannot read them.
 */
const CLEAR_FOR_GRADING = `set -eu
if [ -L /logs ] || { [ -e /logs ] && [ ! -d /logs ]; }; then rm -f -- /logs; fi
mkdir -p /logs && chown 0:0 /logs && chmod 755 /logs
rm -rf -- ${GRADER_OWNED_PATHS.join(' ')}
xargs -0 -r rm -rf --
mkdir -m 700 /tests /sandgym-runner
chown "$TESTS_USER" /tests /sandgym-runner`;

/**
 * Lists the processes of a sandbox other than its agent (pid 1) and this listing's own shell, one
 * `pid name` per line; `read` keeps the loop free of forks that would list themselves.
 */
const LIST_PROCESSES =
  'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; read -r n < "$d/comm" 2>/dev/null && echo "$p $n"; done; true';

/** The name a task's Dockerfile build is stored under. */
function taskEnvironmentName(task: Task): string {
  return `${taskStorageStem('task', task)}:latest`;
}

/**
 * A checkpoint's environment version: readable from the episode id, and unique by construction
 * to the sandbox it saved (two branches named alike, or whose long names share a beginning, must
 * not share checkpoints); a valid version whatever the id holds (a fork's `ep@ckpt:1`).
 */
function checkpointVersion(sandboxId: string, episodeId: string, count: number): string {
  const readable = episodeId.replace(/[^A-Za-z0-9._-]/g, '-').slice(0, 40);
  const digest = createHash('sha256').update(`${sandboxId}\n${episodeId}`).digest('hex').slice(0, 12);
  return `e${readable}-${digest}-${count}`;
}

/** What the agent is shown at reset: the instruction, and where it is. */
export type TaskObservation = SandboxObservation | { type: 'task'; instruction: string; sandboxId: string };

/**
 * A task episode's saved state, for {@link TaskEnv.restore}: at `memory` depth the agent's
 * sandbox's processes, memory and files, restored in place; at `disk` depth its files (minus
 * protected paths), stored as an environment, restored in a new sandbox.
 */
export type TaskCheckpoint = (DiskCheckpointRef | MemoryCheckpointRef) & {
  /** Protected paths the agent had touched by then (reported at grading). */
  tampered: string[];
  /** What was left of the agent's time budget. */
  budgetLeftMs: number;
  /** The task whose episode it saved: it restores into an env of that task only. */
  task: string;
};

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
  /**
   * The training run its sandboxes join (the agent's, its services', its grader's): they follow
   * the run's phases, hibernate when its lease lapses, and go when it ends.
   */
  run?: string;
}

/**
 * A task as a gym environment. Reset starts the task's environment; steps are SandboxEnv
 * actions; submit, or the agent's time budget running out, ends the episode and grades it in a
 * fresh sandbox: the task's layers plus the agent's diff, protected paths restored, tests staged
 * there only, the reward file created empty just before the run and read over the agent channel.
 */
/** What a task's reset says besides the sandbox's. */
export interface TaskResetInfo extends ResetInfo {
  task: string;
  agentTimeoutMs: number;
  /** The network rules of the agent's stage. */
  network: { stage: 'agent'; rules: readonly string[] };
  /** What building or resolving the task's environment noted (stand-ins, skipped services). */
  notes: string[];
  /**
   * MCP servers the task offers its agent (Harbor's `[[environment.mcp_servers]]`), as written:
   * an agent that speaks MCP connects to them from the sandbox; `${VAR}` in a header is the
   * agent's to fill from its own environment, as in Harbor.
   */
  mcpServers?: TaskMcpServer[];
  /** Set by {@link TaskEnv.restore}. */
  restoredFrom?: TaskCheckpoint;
}

/** What a task's step says besides the sandbox's: the grade, once the episode ended. */
export interface TaskStepInfo extends StepInfo {
  grade?: Grade;
  /** Set when the agent's time ran out before this step. */
  timeout?: { budgetMs: number };
}

export class TaskEnv implements Environment<SandboxAction, TaskObservation, TaskResetInfo, TaskStepInfo> {
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
  /** The task's docker-compose services of this episode, if it has any. */
  private services: TaskServices | undefined;
  /** What grading takes from the agent's diff: known once a clean sandbox was probed. */
  private scope: GradingScope = BASE_SCOPE;
  /** Set once this episode is the oracle's: its solution is in the sandbox. */
  private solutionStaged = false;
  /**
   * Set once the episode was graded in the agent's own sandbox: its tests were there, where the
   * agent's processes could read them, so the episode cannot go on (a reset or restore starts anew).
   */
  private gradedInPlace = false;
  /** The processes the agent's sandbox ran when the agent started: its entrypoint's. */
  private startupPids = new Set<string>();
  /** Where this episode's time went, phase by phase: new at each reset. */
  private phases = new PhaseClock();

  private constructor(
    private readonly platform: PlatformClient,
    readonly task: Task,
    private readonly options: TaskEnvOptions,
  ) {}

  /**
   * An env over one task: `reset()` builds (once) and starts the task's environment, steps run
   * the agent's actions, and `submit` grades the work in a fresh sandbox the agent never touched.
   *
   * @example
   * ```ts
   * const [task] = await loadTasks(['examples/tasks/hello-file']);
   * const env = TaskEnv.create(platform, task!);
   * await env.reset();
   * await env.step({ type: 'write_file', path: '/app/hello.txt', content: 'hello sandgym\n' });
   * const { reward } = await env.step({ type: 'submit' });
   * await env.close();
   * ```
   */
  static create(platform: PlatformClient, task: Task, options: TaskEnvOptions = {}): TaskEnv {
    return new TaskEnv(platform, task, options);
  }

  /**
   * The task's environment: stored, or built here from its Dockerfile or git workspace (cached
   * step by step). A cluster client does not build; it uses what a node built under the same name.
   */
  async prepare(): Promise<LayerEnvironment> {
    if (this.built) return this.built;
    try {
      // a task built in code gets the loaders' checks: its numbers out of range are its author's
      checkTaskLimits(this.task);
      checkSharedGradingNetwork(this.task);
      return await this.build();
    } catch (error) {
      throw TaskError.fromPreparing(this.task.id, error);
    }
  }

  private async build(): Promise<LayerEnvironment> {
    const source = this.task.environment;
    if (source.kind === 'stored') return (this.built = await this.platform.getEnvironment(source.ref));
    const platform = hostPlatformOf(this.platform);
    if (!platform) return (this.built = await this.prebuilt());
    let mine = builds.get(this.platform);
    if (!mine) builds.set(this.platform, (mine = new WeakMap()));
    let building = mine.get(this.task);
    if (!building) {
      building = this.buildOn(platform);
      mine.set(this.task, building);
      building.catch(() => mine.delete(this.task));
    }
    const { environment, notes } = await building;
    this.buildNotes = [...notes];
    return (this.built = environment);
  }

  /** Builds the task's environment on a platform that runs sandboxes on this host. */
  private async buildOn(platform: HostPlatform): Promise<Built> {
    const source = this.task.environment;
    if (source.kind === 'workspace')
      return { environment: await workspaceEnvironment(platform, this.task, source), notes: [] };
    if (source.kind === 'image') return platform.resolveImage(source.ref);
    if (source.kind === 'stored')
      return { environment: await platform.getEnvironment(source.ref), notes: [] };
    const result = await platform.buildFromDockerfile({
      file: source.dockerfile,
      context: source.context,
      ...(source.root ? { root: source.root } : {}),
      name: taskEnvironmentName(this.task),
      ...(this.task.buildTimeoutMs ? { timeoutMs: this.task.buildTimeoutMs } : {}),
    });
    return { environment: result.environment, notes: result.notes };
  }

  /** On a cluster: the environment this task's build leaves in the shared store. */
  private async prebuilt(): Promise<LayerEnvironment> {
    const source = this.task.environment;
    const ref =
      source.kind === 'workspace'
        ? workspaceEnvironmentName(this.task, source)
        : source.kind === 'image'
          ? source.ref
          : taskEnvironmentName(this.task);
    try {
      return await this.platform.getEnvironment(ref);
    } catch (error) {
      if (!isSandgymError(error, 'not_found')) throw error;
      throw new SandgymError(
        'failed_precondition',
        `Task ${this.task.id} needs environment ${ref}, which a cluster client cannot build: run \`sandgym eval\` or \`sandgym check\` on the task once on a node that shares the store, with SANDGYM_PROJECT set to your project`,
        { cause: error },
      );
    }
  }

  /** The live agent sandbox, once reset. */
  get sandbox(): Sandbox | undefined {
    return this.inner?.current;
  }

  /** The clock of the current episode: its timings, and the agent's think time when a driver adds it. */
  /** The agent time left in this episode. */
  get budgetLeftMs(): number {
    return Math.max(0, this.deadline - Date.now());
  }

  /** The index the agent's next step will have (0 before a reset). */
  get nextStepIndex(): number {
    return this.inner?.nextStepIndex ?? 0;
  }

  get clock(): PhaseClock {
    return this.phases;
  }

  /** Where the current episode's time went so far, by phase. */
  get timings(): EpisodeTimings {
    return this.phases.snapshot();
  }

  async reset(options: ResetOptions = {}): Promise<ResetResult<TaskObservation, TaskResetInfo>> {
    this.phases = new PhaseClock();
    const environment = await this.phases.time('environment', () => this.prepare());
    this.base = undefined;
    this.earlierTampering = [];
    return this.start(`${environment.name}:${environment.version}`, this.task.agentTimeoutMs, options);
  }

  /**
   * Starts the agent's sandbox from a stored environment, with `budgetMs` of agent time;
   * `restoring` when that environment is a disk checkpoint of an episode.
   */
  private async start(
    environment: string,
    budgetMs: number,
    options: ResetOptions,
    restoring = false,
  ): Promise<ResetResult<TaskObservation, TaskResetInfo>> {
    if (this.isClosed)
      throw new SandgymError('failed_precondition', 'Cannot reset: the environment is closed');
    const clock = this.phases;
    await clock.time('teardown', async () => {
      await this.inner?.close();
      // each episode gets its services fresh, as a new compose project would
      await this.services?.close();
    });
    this.gradedInPlace = false;
    this.services = undefined;
    const serviceNotes: string[] = [];
    this.services = await clock.time('services', () =>
      TaskServices.start(this.platform, this.task, serviceNotes, this.inRun()),
    );
    this.buildNotes.push(...serviceNotes.filter((note) => !this.buildNotes.includes(note)));
    this.inner = SandboxEnv.create(this.platform, {
      sandbox: {
        environment,
        resources: { ...this.task.resources },
        env: this.task.env,
        ...this.workdirOption(),
        network: this.task.network.setup,
        ...this.inRun(),
      },
      ...this.agentOptions(),
    });
    const inner = this.inner;
    const reset = await clock.time('create', () => inner.reset(options));
    const sandbox = inner.current!;
    await clock.time('services', async () => this.services?.join(sandbox, this.mainServiceName()));
    // before anything runs in it, a clean sandbox of the task's environment shows what it holds
    this.scope = gradingScope(
      await clock.time('probe', () => this.cleanFacts(sandbox, environment)),
      this.workdir(),
      this.taskExclusions(),
    );
    // the container's start: its image's ENTRYPOINT, with what the agent finds running
    this.startupPids = new Set();
    const started = await clock.time('taskStartup', () => this.startEntrypoint(sandbox));
    // A checkpoint's files already hold what setup did. Setup runs as root, so run again over the
    // agent's files it would follow the agent's symlinks (a chown or a write onto /etc/shadow),
    // and a script that is not idempotent would fail: it runs only in a fresh episode.
    if (!restoring) {
      await clock.time('staging', async () => {
        await sandbox.exec(['mkdir', '-p', '/logs/agent', '/logs/artifacts']);
        const agentUser = this.userOf(this.task.agentUser);
        // the agent's own log folders are its to write, as Harbor mounts them for it
        if (!isRoot(agentUser))
          await sandbox.exec(['chown', '-R', agentUser, '/logs/agent', '/logs/artifacts']);
      });
      const setupScript = this.task.setupScript;
      if (setupScript !== undefined)
        await clock.time('taskStartup', () => this.runSetupScript(sandbox, setupScript));
    }
    // the stage boundary: the same sandbox, the agent stage's rules
    await clock.time('network', () => sandbox.setNetwork(this.task.network.agent));
    // the agent starts once the container is healthy, and its time with it
    await clock.time('taskStartup', () => this.waitHealthy(sandbox));
    // what runs now is the container's, not the agent's leftovers (see leftoverProcesses)
    if (started)
      this.startupPids = new Set(
        (await clock.time('inspect', () => this.processes(sandbox))).map(([pid]) => pid),
      );
    this.deadline = Date.now() + budgetMs;
    return this.opening(sandbox, reset.info);
  }

  /**
   * Puts the task's solution where its oracle runs it from (a Harbor task's solution folder at
   * /solution, a Terminal-Bench task's script), as the platform's own write, the way Harbor
   * uploads it for its oracle agent; Harbor's folder is then the agent user's, as a task may ask
   * for answers there. The oracle's actions run as that user like any agent's. Only a run of the
   * oracle asks for this: no other agent ever sees a solution.
   */
  async stageSolution(): Promise<void> {
    const sandbox = this.inner?.current;
    if (!sandbox) throw new SandgymError('failed_precondition', 'Call reset() before stageSolution()');
    await this.phases.time('staging', () => this.stageSolutionIn(sandbox));
  }

  private async stageSolutionIn(sandbox: Sandbox): Promise<void> {
    const oracle = this.task.oracle;
    if (oracle?.kind === 'shell') await sandbox.writeFile(oracle.path, oracle.script, { mode: 0o755 });
    // a reference program or a patch the oracle writes as any agent would
    this.solutionStaged = true;
    if (oracle?.kind !== 'script') return;
    await stageFolder(sandbox, oracle.dir, HARBOR_SOLUTION_DIR);
    const user = this.userOf(this.task.agentUser);
    if (!isRoot(user)) await sandbox.exec(['chown', '-R', user, HARBOR_SOLUTION_DIR]);
  }

  /** The interpreters of the sandbox's environment, probed once per layer stack. */
  /** The `run` field of this env's sandbox requests, if it has a run. */
  private inRun(): { run?: string } {
    return this.options.run ? { run: this.options.run } : {};
  }

  /**
   * What a clean sandbox of the task's own environment holds: the agent's fresh sandbox itself,
   * or, when it started from a checkpoint that holds the agent's earlier changes, a sandbox made
   * to be probed and closed.
   */
  private cleanFacts(sandbox: Sandbox, environment: string): Promise<InterpreterFacts> {
    const built = this.built;
    if (!built || environment === `${built.name}:${built.version}`)
      return this.facts(sandbox.layers, () => probeInterpreters(sandbox));
    return this.facts(
      built.layers.map((digest) => ({ digest })),
      async () => {
        await using clean = await this.platform.createSandbox({
          environment: `${built.name}:${built.version}`,
          resources: { ...this.task.resources },
          env: this.task.env,
          ...this.inRun(),
        });
        // awaited here: the probe must end before `clean` is disposed of
        return await probeInterpreters(clean);
      },
    );
  }

  private facts(
    layers: readonly { digest: string }[],
    probe: () => Promise<InterpreterFacts>,
  ): Promise<InterpreterFacts> {
    return cachedPromise(probed, layers.map((layer) => layer.digest).join(','), probe);
  }

  /** Who runs as `taskUser` when the task names one, else the image's USER; root is the default. */
  private userOf(taskUser: string | undefined): string {
    return taskUser ?? this.built?.config.user ?? 'root';
  }

  /**
   * How the agent's env steps, whether it made the sandbox or took it over: its user always
   * named (root too), so it never falls back on anything but the task's choice.
   */
  private agentOptions(): { protectedPaths: readonly string[]; user: string } {
    return { protectedPaths: PROTECTED_PATHS, user: this.userOf(this.task.agentUser) };
  }

  /** What the task's own sandbox is called on its services' network, as its compose file names it. */
  private mainServiceName(): string {
    return this.task.format === 'terminal-bench' ? 'client' : 'main';
  }

  /** Where commands run: the task's own workdir (Harbor's `[environment] workdir`) over the image's. */
  private workdir(): string {
    return this.task.workdir ?? this.built?.config.workdir ?? '/';
  }

  /** The sandbox option that puts commands in the task's workdir, when it names one. */
  private workdirOption(): { workdir?: string } {
    return this.task.workdir ? { workdir: this.task.workdir } : {};
  }

  /** Paths only this task's grading leaves out: a SWE-bench repository's git folder. */
  private taskExclusions(): string[] {
    const grading = this.task.grading;
    return grading.kind === 'swebench' ? [`${grading.repoPath}/.git`] : [];
  }

  /** Where the ENTRYPOINT starts: the task's workdir where it names one, else the image's. */
  private entrypointWorkdir(): string {
    return this.task.workdir ?? this.workdir();
  }

  /** Starts the image's ENTRYPOINT in `sandbox` as its USER, as Docker starts a container. */
  private async startEntrypoint(sandbox: Sandbox): Promise<boolean> {
    if (!this.built) return false;
    return startEntrypoint(sandbox, this.built, {
      user: this.userOf(undefined),
      workdir: this.entrypointWorkdir(),
    });
  }

  /** Waits until the task's healthcheck passes in `sandbox`, if it has one (see healthcheck.ts). */
  private async waitHealthy(sandbox: Sandbox): Promise<void> {
    if (!this.task.healthcheck) return;
    await waitHealthy(this.task.id, sandbox, this.task.healthcheck, {
      user: this.userOf(undefined),
      cwd: this.entrypointWorkdir(),
    });
  }

  private async runSetupScript(sandbox: Sandbox, script: string): Promise<void> {
    const result = await sandbox.exec(['sh', '-c', script], { timeoutMs: SETUP_SCRIPT_TIMEOUT_MS });
    if (result.exitCode === 0) return;
    const tail = (result.stderr || result.stdout).trim().split('\n').slice(-3).join(' | ');
    // what the network refused it is often why: a mirror the setup stage's rules do not name
    const network = (await sandbox.stats().catch(() => undefined))?.network;
    const refused = network ? recordText(network) : '';
    throw new TaskError(
      this.task.id,
      `its setup script failed (${result.timedOut ? 'timed out' : `exit ${result.exitCode}`}): ${tail || 'no output'}${refused ? ` (its network: ${refused})` : ''}`,
    );
  }

  private opening(sandbox: Sandbox, info: ResetInfo): ResetResult<TaskObservation, TaskResetInfo> {
    return {
      observation: { type: 'task', instruction: this.task.instruction, sandboxId: sandbox.id },
      info: {
        ...info,
        task: this.task.id,
        agentTimeoutMs: this.task.agentTimeoutMs,
        network: { stage: 'agent', rules: this.task.network.agent },
        notes: this.buildNotes,
        ...(this.task.mcpServers?.length ? { mcpServers: this.task.mcpServers } : {}),
      },
    };
  }

  /**
   * Takes over an episode whose sandbox outlived the client that ran it (an eval that was
   * killed): its logged steps replay from the trajectory log as the agent re-issues them, and
   * the first step past the log runs for real. `budgetLeftMs` is the agent time still left;
   * `nextStepIndex` is where the agent goes on (default 0: from the episode's start).
   */
  async attach(
    sandbox: Sandbox,
    episodeId: string,
    budgetLeftMs: number,
    options: { nextStepIndex?: number } = {},
  ): Promise<ResetResult<TaskObservation, TaskResetInfo>> {
    if (this.isClosed)
      throw new SandgymError('failed_precondition', 'Cannot attach: the environment is closed');
    this.phases = new PhaseClock();
    await this.phases.time('environment', () => this.prepare());
    await this.inner?.close();
    this.inner = await SandboxEnv.attach(this.platform, sandbox, episodeId, {
      owned: true,
      ...this.agentOptions(),
      ...(options.nextStepIndex === undefined ? {} : { nextStepIndex: options.nextStepIndex }),
    });
    this.deadline = Date.now() + Math.floor(budgetLeftMs);
    return this.opening(sandbox, { episodeId, sandboxId: sandbox.id, attached: true });
  }

  /**
   * Saves the episode so far, at the deepest depth the agent's sandbox has, and says which: its
   * processes and memory where it can (`memory`, restored in place); else (or asked for `disk`)
   * the agent's changes, minus protected paths (reported as tampering when graded), as a layer
   * over the task's, stored as an environment.
   */
  async checkpoint(options: { depth?: 'disk' | 'memory' } = {}): Promise<TaskCheckpoint> {
    const agent = this.inner?.current;
    const environment = this.built;
    if (!agent || !environment || !this.inner)
      throw new SandgymError('failed_precondition', 'Nothing to checkpoint: call reset() first');
    // the tests ran in this sandbox: a copy of it could carry what they left, or what was taken
    if (this.gradedInPlace)
      throw new SandgymError(
        'failed_precondition',
        `Task ${this.task.id} was graded in the agent's own sandbox, which ends the episode: checkpoint before grading, or reset()`,
      );
    const budgetLeftMs = this.budgetLeftMs;
    if (options.depth !== 'disk') {
      const memory = await this.inner.checkpointMemory();
      if (memory)
        return { ...memory, tampered: [...this.earlierTampering], budgetLeftMs, task: this.task.id };
      if (options.depth === 'memory')
        throw new SandgymError(
          'unsupported',
          `The agent's ${agent.backend} sandbox has no memory checkpoints`,
        );
    }
    const name = taskStorageStem('ckpt', this.task);
    const version = checkpointVersion(agent.id, this.inner.episode, ++this.checkpoints);
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
      budgetLeftMs,
      task: this.task.id,
      depth: 'disk',
    };
  }

  /**
   * Goes back to a checkpoint, the episode going on from there as a new branch: a memory one in
   * place, in the agent's sandbox that made it; a disk one in a new sandbox.
   */
  async restore(
    checkpoint: TaskCheckpoint,
    options: { episodeId?: string } = {},
  ): Promise<ResetResult<TaskObservation, TaskResetInfo>> {
    // another task's files graded by this task's tests would score work never done for it
    if (checkpoint.task !== this.task.id)
      throw new SandgymError(
        'failed_precondition',
        `The checkpoint is of task ${checkpoint.task}, not of this env's task ${this.task.id}: restore it into an env of that task`,
      );
    if (checkpoint.depth === 'memory') {
      if (!this.inner)
        throw new SandgymError('failed_precondition', 'Nothing to restore into: call reset() first');
      const restored = await this.inner.restore(checkpoint);
      this.gradedInPlace = false;
      this.deadline = Date.now() + Math.floor(checkpoint.budgetLeftMs);
      this.earlierTampering = checkpoint.tampered;
      const opened = this.opening(this.inner.current!, restored.info);
      return { ...opened, info: { ...opened.info, restoredFrom: checkpoint } };
    }
    await this.prepare();
    const restored = await this.start(
      checkpoint.environment,
      checkpoint.budgetLeftMs,
      { options: { episodeId: options.episodeId ?? `${checkpoint.episodeId}@${checkpoint.environment}` } },
      true,
    );
    this.base = checkpoint.environment;
    this.earlierTampering = checkpoint.tampered;
    return { ...restored, info: { ...restored.info, restoredFrom: checkpoint } };
  }

  async step(
    action: SandboxAction,
    options: EnvCallOptions = {},
  ): Promise<StepResult<TaskObservation, TaskStepInfo>> {
    const inner = this.inner;
    if (!inner) throw new SandgymError('failed_precondition', 'Call reset() before step()');
    if (this.gradedInPlace)
      throw new SandgymError(
        'failed_precondition',
        `Task ${this.task.id} was graded in the agent's own sandbox (its shared verifier mode), which ends the episode: reset() or restore() a checkpoint to go on`,
      );
    const left = this.deadline - Date.now();
    const outOfTime = left <= 0;

    const result: StepResult<TaskObservation, TaskStepInfo> = outOfTime
      ? {
          observation: { type: 'submitted' },
          reward: 0,
          terminated: false,
          truncated: true,
          // nothing ran: the index stays for whoever goes on
          info: { episodeId: inner.episode, stepIndex: inner.nextStepIndex, replayed: false },
          outcome: { kind: 'ok' },
        }
      : await this.timedStep(inner, action, { ...options, commandTimeoutCapMs: left });
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
      return { ...result, reward: 0, outcome: gradingFailure(error) };
    }
  }

  /** One step of the agent's sandbox, its command's own time apart from the platform's. */
  private async timedStep(
    inner: SandboxEnv,
    action: SandboxAction,
    options: EnvCallOptions & { commandTimeoutCapMs: number },
  ): Promise<StepResult<SandboxObservation, StepInfo>> {
    const result = await this.phases.time('step', () => inner.step(action, options));
    const observation = result.observation;
    if (observation.type === 'exec' && !result.info.replayed)
      this.phases.move('step', 'command', observation.durationMs);
    return result;
  }

  /**
   * Grades the episode so far in a fresh sandbox of the task's layers plus the agent's diff (taken
   * from a frozen copy of its sandbox, pruned by the grading scope). A run that goes wrong in a way
   * either side could cause (see GradingAnomaly: the tests hang, the reward is missing or out of
   * range, the grader dies) is run again without the agent's diff: if that run is sound, the
   * agent's changes caused the trouble and the episode scores 0 with the anomaly in its details;
   * if it fails too, the verifier is at fault and grading fails (`verifier_error`).
   */
  async grade(options: { mode?: VerifierMode } = {}): Promise<Grade> {
    const agent = this.inner?.current;
    try {
      return await this.gradeOnce(options.mode ?? this.task.verifierMode ?? 'fresh');
    } finally {
      // an episode graded midway goes on with its services
      if (agent && this.services && !this.isClosed && !this.gradedInPlace)
        await this.services.join(agent, this.mainServiceName()).catch(() => undefined);
    }
  }

  private async gradeOnce(mode: VerifierMode): Promise<Grade> {
    const agent = this.inner?.current;
    const environment = this.built;
    if (!agent || !environment)
      throw new SandgymError('failed_precondition', 'Nothing to grade: call reset() first');
    if (this.gradedInPlace)
      throw new SandgymError(
        'failed_precondition',
        `Task ${this.task.id}'s episode was already graded in its sandbox`,
      );
    // what runs there now: gone in a fresh grader, which a task author must be able to see
    const clock = this.phases;
    const leftover = await clock.time('inspect', () => this.leftoverProcesses(agent));
    // no name: a layer for this grading only, which layer gc reclaims later
    const packed = await clock.time('diff', () =>
      this.platform.packDiff(agent, this.diffOptions()).catch((error: unknown) => {
        if (isDiffLargerThanDisk(error)) return error as Error;
        throw error;
      }),
    );
    // the agent stage's record: read before grading sets the verify stage's rules
    const { deniedEgress, network: agentNetwork } = await clock.time('inspect', () => agent.stats());
    const clean = `${environment.name}:${environment.version}`;
    let graderNetwork: NetworkRecord | undefined;
    const network = (): Record<string, unknown> => {
      const report = networkReport({ agent: agentNetwork, grader: graderNetwork });
      return report ? { network: report } : {};
    };
    /** The grade of a verdict: what the agent touched beside it, and the stages' network records. */
    const graded = (verdict: VerifierResult, tampered: string[], extra: Record<string, unknown>): Grade => ({
      reward: verdict.reward,
      tampered,
      deniedEgress,
      details: { ...verdict.details, ...extra, ...network() },
    });
    // changes larger than the agent's disk (sparse files) are its own doing: scored, never packed;
    // graded in place too, since the diff names the start-up hooks to remove before the tests
    if (packed instanceof Error) {
      return {
        reward: 0,
        tampered: [...this.earlierTampering],
        deniedEgress,
        details: { reason: `the agent's changes cannot be graded: ${packed.message}`, ...network() },
      };
    }
    if (mode === 'shared') {
      const touched = packed.present;
      const excluded = packed.excludedByPattern;
      // grading in place removes the hooks the report lists, and a report lists a bounded number:
      // past it, hooks the agent hid behind a flood of harmless ones would run with the tests
      if (packed.excludedByPatternCut) {
        return {
          reward: 0,
          tampered: [...this.earlierTampering],
          deniedEgress,
          details: {
            reason: `the agent left more than ${PACK_REPORT_MAX_ENTRIES} start-up hooks and caches (.pth files, sitecustomize, __pycache__ folders, entry point tables), more than grading in its own sandbox can remove before the tests: scored 0`,
            ...network(),
          },
        };
      }
      // start-up hooks a fresh grader would never have go; the image's modules the agent
      // replaced (which no live sandbox can put back) are named as tampering
      const hooks = startUpHooksIn(excluded);
      const replaced = excluded.filter((path) => !isHomeToolPath(path) && !hooks.includes(path));
      const tampered = [
        ...new Set([...this.earlierTampering, ...[...touched, ...replaced.slice(0, 20)].map((p) => `/${p}`)]),
      ];
      const verdict = await this.gradeInPlace(agent, clean, hooks, (record) => (graderNetwork = record));
      return graded(verdict, tampered, {
        gradedIn: 'the agent sandbox',
        leftoverProcesses: leftover,
        ...(hooks.length ? { removedBeforeGrading: hooks.slice(0, 50).map((p) => `/${p}`) } : {}),
        ...this.sharedUserResidual(),
      });
    }
    const { layer, present, dropped } = packed;
    // while it is graded, the agent's sandbox is off its services' network (see TaskServices.leave)
    await this.services?.leave(agent);
    const tampered = [...new Set([...this.earlierTampering, ...present.map((path) => `/${path}`)])];
    // the agent's work is its diff over where its sandbox started (a checkpoint's stack, after a
    // restore); the control run has none of it, so it starts from the task's own environment
    const withDiff = await this.judge(
      this.base ?? clean,
      [layer.digest],
      this.services,
      (record) => (graderNetwork = record),
    ).then(
      (verdict) => ({ verdict }),
      (error: unknown) => ({ error }),
    );
    let verdict: VerifierResult;
    if ('verdict' in withDiff) {
      verdict = withDiff.verdict;
    } else {
      if (isSandgymError(withDiff.error, ...INFRA_CODES)) throw withDiff.error;
      verdict = await this.blame(clean, withDiff.error);
    }
    // Tampering is reported, not punished: the protected paths came from the task's own layers,
    // so the verifier judged the real work.
    return graded(verdict, tampered, {
      ...(dropped.length ? { droppedFromDiff: dropped } : {}),
      ...(leftover.length ? { leftoverProcesses: leftover, leftoverNote: LEFTOVER_NOTE } : {}),
    });
  }

  /**
   * Grades in the agent's own live sandbox, as Harbor's shared verifier mode does: the tests see
   * the processes the agent left running and the files as they are. What the agent left at the
   * graders' paths goes first, so the tests, harness and reward folder are the platform's own;
   * the verifier then ends every process of the sandbox, and the episode with it. A process the
   * agent left running as root can still reach the tests and the reward while they run (the
   * sandbox has one mount namespace and one root): docs/security.md says so, and an agent that
   * runs as another user than the tests cannot.
   */
  private async gradeInPlace(
    agent: Sandbox,
    clean: string,
    hooks: string[],
    onNetwork: (record: NetworkRecord | undefined) => void,
  ): Promise<VerifierResult> {
    this.gradedInPlace = true;
    try {
      const cleared = await agent.exec(['sh', '-c', CLEAR_FOR_GRADING], {
        // on stdin, NUL-separated: 10,000 hook paths as arguments overflow ARG_MAX, and a name
        // holding a newline must stay one name
        stdin: hooks.map((p) => `/${p}\0`).join(''),
        timeoutMs: 60_000,
        env: { TESTS_USER: this.userOf(this.task.verifierUser) },
      });
      // never wider than the agent's stage (checkSharedGradingNetwork): its processes are still here
      await agent.setNetwork(this.task.network.verify);
      const run =
        cleared.exitCode === 0
          ? await this.verifyIn(agent, this.base ?? clean).then(
              (verdict) => ({ verdict }),
              (error: unknown) => ({ error }),
            )
          : {
              error: new GradingAnomaly(
                'harness_rewired',
                `The agent's sandbox kept what it left at ${GRADER_OWNED_PATHS.join(', ')}: ${cleared.stderr.trim().slice(-300)}`,
              ),
            };
      // the verify stage's record, from the sandbox the tests ran in
      onNetwork((await agent.stats().catch(() => undefined))?.network);
      if ('verdict' in run) return run.verdict;
      if (isSandgymError(run.error, ...INFRA_CODES)) throw run.error;
      return await this.blame(clean, run.error);
    } finally {
      // whoever takes the sandbox over next (an attach, a resumed eval) finds no tests in it
      await agent
        .exec(['rm', '-rf', '--', ...GRADER_OWNED_PATHS], { timeoutMs: 60_000 })
        .catch(() => undefined);
    }
  }

  /**
   * Graded in place, the agent's leftover processes run beside the tests; when they are the
   * tests' user too, nothing keeps them from the tests or the reward (docs/security.md).
   */
  private sharedUserResidual(): { residual?: string } {
    const agent = this.userOf(this.task.agentUser);
    if (agent !== this.userOf(this.task.verifierUser)) return {};
    return {
      residual: `the agent ran as the tests' user (${agent}): a process it left running could reach the tests and the reward while they ran`,
    };
  }

  /**
   * The names of the processes running in `sandbox` besides its agent and what its start left
   * running (the image's entrypoint, which a fresh grader starts again).
   */
  private async leftoverProcesses(sandbox: Sandbox): Promise<string[]> {
    return (await this.processes(sandbox))
      .filter(([pid]) => !this.startupPids.has(pid))
      .map(([, name]) => name)
      .slice(0, 50);
  }

  /** The `[pid, name]` of each process of `sandbox` but its agent; none when they cannot be listed. */
  private async processes(sandbox: Sandbox): Promise<[string, string][]> {
    const listed = await sandbox
      .exec(['sh', '-c', LIST_PROCESSES], { timeoutMs: 30_000 })
      .catch(() => undefined);
    if (listed?.exitCode !== 0) return [];
    return listed.stdout
      .split('\n')
      .filter(Boolean)
      .map((line): [string, string] => {
        const space = line.indexOf(' ');
        return [line.slice(0, space), line.slice(space + 1)];
      });
  }

  /**
   * Decides who caused an anomaly of the run with the agent's changes, by running the verifier
   * on `clean` without them: sound there, the agent's changes caused it (reward 0); the same
   * anomaly there, where the first run had a verdict, is the verifier's habit (that verdict
   * stands); anything else there, the verifier is at fault.
   */
  private async blame(clean: string, error: unknown): Promise<VerifierResult> {
    const anomaly = messageOf(error);
    // without the agent's changes means without what it did to the services too: fresh ones
    const services = await TaskServices.start(this.platform, this.task, [], this.inRun());
    const control = await this.judge(clean, [], services)
      .then(
        () => undefined,
        (failure: unknown) => failure,
      )
      .finally(() => services?.close());
    if (control === undefined)
      return {
        reward: 0,
        details: {
          reason: `the agent's changes broke grading: ${anomaly}`,
          anomaly,
          control: "the verifier runs soundly without the agent's changes, so they caused it",
        },
      };
    const alike =
      error instanceof GradingAnomaly && control instanceof GradingAnomaly && control.kind === error.kind;
    // a habit is the same anomaly in every word (the same tests skipped, the same file): the same
    // kind alone would let the agent's run hide its own skip behind the task's optional one
    if (alike && error.verdict && control.message === error.message)
      return {
        ...error.verdict,
        details: {
          ...error.verdict.details,
          anomaly,
          control: "the verifier shows the same without the agent's changes: it is the verifier's way",
        },
      };
    // Both runs failed alike: either the verifier is broken, or the task's starting state fails
    // its tests before they can report (a stub that does not compile), which the harness scores 0.
    // Only a run of the oracle tells the two apart; without one, the verifier takes the blame.
    // Runs that failed differently are no starting state's doing: the verifier's.
    const oracle = alike
      ? await this.oracleVerdict(clean)
      : { passes: false, why: 'and the two failed differently' };
    if (oracle.passes)
      return {
        reward: 0,
        details: {
          reason: `unresolved: the tests fail the same way with the agent's changes (${anomaly}) and on the task's starting state (${messageOf(control)}), and they pass the task's oracle, so the verifier works`,
          anomaly,
          control: "the task's starting state fails the same way; its oracle passes",
        },
      };
    throw new SandgymError(
      'failed_precondition',
      `The verifier of task ${this.task.id} failed with the agent's changes (${anomaly}) and without them too (${messageOf(control)}), ${oracle.why}: the verifier is at fault${lastWords(control)}`,
      { cause: control },
    );
  }

  /**
   * Whether the task's verifier passes its own oracle (run once per task and environment in this
   * process, in an env of its own). Never from the oracle's own episode: there, a failure is the
   * verifier's.
   */
  private oracleVerdict(clean: string): Promise<OracleVerdict> {
    if (this.solutionStaged) return Promise.resolve({ passes: false, why: "and this is the task's oracle" });
    if (!this.task.oracle)
      return Promise.resolve({ passes: false, why: 'and the task has no oracle to tell' });
    const stack = this.built?.layers.join(',') ?? clean;
    let verdicts = oracleVerdicts.get(this.task);
    if (!verdicts) {
      verdicts = new Map<string, Promise<OracleVerdict>>();
      oracleVerdicts.set(this.task, verdicts);
    }
    // an oracle run the platform failed is not kept: the next episode asks again
    return cachedPromise(verdicts, stack, async () => {
      const { reward, outcome } = await this.runOracle();
      if (outcome.kind === 'infra_failure') throw new Error(outcome.message);
      return outcome.kind === 'ok' && reward > 0
        ? { passes: true, why: '' }
        : { passes: false, why: `and so does the task's oracle (${outcomeText(reward, outcome)})` };
    }).catch((error: unknown) => ({
      passes: false,
      why: `and the task's oracle could not run (${messageOf(error)})`,
    }));
  }

  /** One episode of the task's oracle, graded: what `sandgym check` runs, from inside grading. */
  private async runOracle(): Promise<{ reward: number; outcome: StepOutcome }> {
    const oracle = TaskEnv.create(this.platform, this.task, this.options);
    try {
      await oracle.reset();
      await oracle.stageSolution();
      for (const action of [...oraclePlan(this.task), { type: 'submit' } as const]) {
        const { reward, outcome, terminated, truncated } = await oracle.step(action);
        if (outcome.kind !== 'ok' || terminated || truncated) return { reward, outcome };
      }
      return { reward: 0, outcome: { kind: 'ok' } };
    } finally {
      await oracle.close();
    }
  }

  /**
   * Runs the verifiers in a fresh grader of `environment` plus `extraLayers`, within the grading
   * deadline; `onNetwork` hears what the grader's network refused it, however the run ended.
   */
  private async judge(
    environment: string,
    extraLayers: string[],
    services: TaskServices | undefined = this.services,
    onNetwork?: (record: NetworkRecord | undefined) => void,
  ): Promise<VerifierResult> {
    const clock = this.phases;
    const grader = await clock.time('graderCreate', () =>
      this.platform.createSandbox({
        environment,
        ...(extraLayers.length ? { extraLayers } : {}),
        resources: { ...this.task.resources },
        // the task's variables are the container's, so its tests see them as the agent did
        env: this.task.env,
        ...this.workdirOption(),
        network: this.task.network.verify,
        ...this.inRun(),
      }),
    );
    try {
      // the tests reach the services the agent worked with, by the same names
      await clock.time('services', async () => services?.join(grader, this.mainServiceName()));
      // No ENTRYPOINT or healthcheck here: run as root over the agent's diff before the tests,
      // they would run whatever the agent left for them to read (a config they source, a script
      // in the workdir) and could replace the tests' tools. In Docker they ran once, over the
      // image's own files, in the agent's container: tests that need what they started are
      // graded there (environment_mode "shared"), which `sandgym check` tells their author.
      return await this.verifyIn(grader, environment);
    } finally {
      await clock.time('graderTeardown', async () => {
        if (onNetwork) onNetwork((await grader.stats().catch(() => undefined))?.network);
        await services?.leave(grader).catch(() => undefined);
        await grader.close();
      });
    }
  }

  /** Runs the verifiers in `grader` (made from `environment`), within the grading deadline. */
  private verifyIn(grader: Sandbox, environment: string): Promise<VerifierResult> {
    const testUser = this.userOf(this.task.verifierUser);
    const clock = this.phases;
    return clock.time('graderStaging', () =>
      runVerifiers([...(this.options.verifiers ?? []), defaultVerifier(this.task)], {
        task: this.task,
        grader,
        workdir: this.workdir(),
        platform: this.platform,
        environment,
        imageEnv: this.built?.config.env ?? {},
        ...(isRoot(testUser) ? {} : { user: testUser }),
        deadline: Deadline.after(
          this.task.verifierTimeoutMs + GRADING_OVERHEAD_MS,
          `Grading task ${this.task.id}`,
        ),
        clock,
      }),
    );
  }

  /** The agent's changes without what grading never takes from it, reporting the protected paths it touched. */
  private diffOptions(): GradingScope {
    return this.scope;
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    // off its services' network before its sandbox ends (and its shell may go back to the pool)
    const agent = this.inner?.current;
    await this.phases.time('teardown', async () => {
      if (agent) await this.services?.leave(agent).catch(() => undefined);
      await this.inner?.close();
      await this.services?.close();
    });
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Whether a task's user is root (by name or uid), for whom nothing needs handing over. */
function isRoot(user: string): boolean {
  const [name] = user.split(':');
  return name === 'root' || name === '0';
}
