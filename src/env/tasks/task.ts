import { createHash } from 'node:crypto';
import { z } from 'zod';
import { SandgymError, isSandgymError, issuesText, messageOf } from '../../common/index.ts';
import { SANDBOX_LIMITS } from '../../platform/index.ts';
import type { RepoTestRunner } from './swebench-repos.ts';

/**
 * A task that cannot run as written: its Dockerfile does not parse or a step of it fails, a file
 * it names is missing, its repository or base commit cannot be had, its setup script fails. The
 * task's author must change it; retrying does not help, and it is bad input, not infrastructure.
 */
export class TaskError extends SandgymError {
  constructor(
    readonly taskId: string,
    message: string,
    options: { cause?: unknown } = {},
  ) {
    super('invalid_argument', `Task ${taskId}: ${message}`, options);
  }

  /**
   * The error of preparing a task, as a TaskError when the task's content caused it (bad input,
   * a missing file, a failing build step); anything else (the platform's) is returned as it was.
   */
  static fromPreparing(taskId: string, error: unknown): unknown {
    if (error instanceof TaskError) return error;
    if (!isSandgymError(error, 'invalid_argument', 'not_found', 'failed_precondition')) return error;
    return new TaskError(taskId, messageOf(error), { cause: error });
  }
}

/**
 * A task's own Dockerfile and build context. `root` is the task's folder: the Dockerfile, the
 * context and everything the build reads must lie beneath it, symlinks followed (a task author's
 * symlink to the host is refused, never built from).
 */
export interface DockerfileSource {
  kind: 'dockerfile';
  dockerfile: string;
  context: string;
  root?: string;
}

/**
 * Where a task's environment comes from: its own Dockerfile, an environment in the store, or a
 * stored base plus a git workspace checked out at a base commit with its later history scrubbed.
 */
export type TaskEnvironmentSource =
  | DockerfileSource
  | { kind: 'stored'; ref: string }
  /** A prebuilt image (Harbor's `docker_image`): from the store or its registry. */
  | { kind: 'image'; ref: string }
  | {
      kind: 'workspace';
      base: string;
      repo: string;
      baseCommit: string;
      path: string;
      /** What the repository needs installed over the checkout (SWE-bench's per-repository recipe). */
      setup?: { apt: string[]; install?: string };
    };

/**
 * A task's network, stage by stage: names of rules (`mirror:debian`, `pypi`, `internet`, ...)
 * that node configuration resolves to address sets. Empty means loopback only.
 */
export interface NetworkPolicy {
  setup: string[];
  agent: string[];
  verify: string[];
}

/** Loopback only, in every stage: the default. */
export const NO_NETWORK: NetworkPolicy = { setup: [], agent: [], verify: [] };

/**
 * What a harness's "public" network is on a node: the internet where the node defines an
 * `internet` rule, and its package mirrors and DNS where it has them. Each rule is optional, so
 * a node without them runs the task with less rather than refusing it.
 */
export const PUBLIC_NETWORK: readonly string[] = ['internet?', 'mirror:debian?', 'mirror:npm?', 'dns?'];

/** One OJ test case: the input and the expected output. */
export interface OjCase {
  stdin: string;
  stdout: string;
}

/**
 * A service a task runs beside its sandbox (a docker-compose service other than the task's own):
 * started with the sandbox as one group on a private network, reachable there by `name`.
 */
export interface TaskService {
  name: string;
  /** Its own Dockerfile, or an image (from the store or its registry). */
  source: DockerfileSource | { kind: 'image'; ref: string };
  /** What it runs: compose's `command` and `entrypoint`, else the image's CMD and ENTRYPOINT. */
  command?: string[];
  entrypoint?: string[];
  env: Record<string, string>;
}

/**
 * A readiness check run before the agent starts (Harbor's `[environment.healthcheck]`), with
 * Docker HEALTHCHECK's meaning: every `interval` a run of `command` (a shell line) that must exit
 * 0 within `timeout`; failures during `startPeriod` (probed every `startInterval`) do not count,
 * and `retries` failures in a row after it fail the task's start.
 */
export interface TaskHealthcheck {
  command: string;
  intervalMs: number;
  timeoutMs: number;
  startPeriodMs: number;
  startIntervalMs: number;
  retries: number;
}

/** An MCP server a task offers its agent (Harbor's `[[environment.mcp_servers]]`). */
export interface TaskMcpServer {
  name: string;
  transport: 'stdio' | 'sse' | 'streamable-http';
  /** For the HTTP transports: where it listens, as seen from the agent's sandbox. */
  url?: string;
  /** For stdio: the command line started in the agent's sandbox. */
  command?: string;
  args: string[];
  headers: Record<string, string>;
}

/**
 * Where a task is graded. `fresh` (the default): a new sandbox of the task's layers plus the
 * agent's diff, which nothing the agent left running can reach. `shared` (Harbor's
 * `[verifier] environment_mode = "shared"`): in the agent's own live sandbox, for tests that
 * check what the agent left running (a daemon, a tunnel); see docs/security.md for what that
 * mode can and cannot keep from the agent's processes.
 */
export type VerifierMode = 'fresh' | 'shared';

/** How a task is graded, by its format. */
export type TaskGrading =
  /** Harbor: tests/test.sh writes /logs/verifier/reward.txt or reward.json. */
  | { kind: 'reward_file'; testsDir: string }
  /**
   * Terminal-Bench: tests/ and run-tests.sh staged at /tests, `bash /tests/run-tests.sh` run, its
   * output read by a test-log parser; reward 1 when tests were found and every one passed.
   */
  | { kind: 'test_log'; testsDir: string | undefined; runTests: string; parser: 'pytest' }
  /** OJ: the agent's program at `program` runs once per case; normalised stdout must match. */
  | { kind: 'oj'; program: string; run: string[]; cases: OjCase[]; caseTimeoutMs: number }
  /** SWE-bench: test files reset to the base commit, the test patch applied, every listed test must pass. */
  | {
      kind: 'swebench';
      /** The row's `repo` (`owner/name`): how swebench names its tests depends on it. */
      repo: string;
      repoPath: string;
      baseCommit: string;
      testPatch: string;
      failToPass: string[];
      passToPass: string[];
      /** The repository's own test runner, where its test ids are neither unittest nor pytest names. */
      runner?: RepoTestRunner;
    };

/** A task, whatever format it came in: what the agent is told, where it runs, how it is graded. */
export interface Task {
  id: string;
  format: 'harbor' | 'terminal-bench' | 'oj' | 'swebench';
  /** The file or folder it was loaded from. */
  source: string;
  instruction: string;
  environment: TaskEnvironmentSource;
  /** Services that run beside the task's sandbox (docker-compose), none when absent. */
  services?: TaskService[];
  grading: TaskGrading;
  /** What its sandboxes get; `diskMib` absent is the node's default. */
  resources: { cpu: number; memoryMib: number; diskMib?: number };
  env: Record<string, string>;
  /** Variables the verifier's tests run with (Harbor's `[verifier] env`), on top of `env`. */
  verifierEnv?: Record<string, string>;
  /** Who the agent's commands run as (Harbor's `[agent] user`); default the image's USER. */
  agentUser?: string;
  /** Who the tests run as (Harbor's `[verifier] user`); default the image's USER. */
  verifierUser?: string;
  agentTimeoutMs: number;
  verifierTimeoutMs: number;
  /** How long building its environment may take (Harbor's `build_timeout_sec`); default no limit. */
  buildTimeoutMs?: number;
  /** The range a verifier's reward must fall in (a reward outside it is a verifier anomaly); default [0, 1]. */
  rewardRange?: readonly [number, number];
  /** Named network rules per stage (empty: loopback only, the default). */
  network: NetworkPolicy;
  /**
   * A shell script run as root in the agent's sandbox before the agent starts, under the `setup`
   * stage's network rules (installing from a mirror, say). None in any task format yet: set by code.
   */
  setupScript?: string;
  /** Run before the agent starts, in its sandbox; a failing one fails the task's start. */
  healthcheck?: TaskHealthcheck;
  /**
   * Whether a model agent runs every tool call of an answer (the default) or only the first
   * (false: Harbor `[agent] parallel_tool_calls`, sandgym's own key).
   */
  parallelToolCalls?: boolean;
  /** MCP servers the agent may use (handed to agents that speak MCP). */
  mcpServers?: TaskMcpServer[];
  /** Where grading runs; default `fresh`. */
  verifierMode?: VerifierMode;
  /** The working directory of commands, over the image's WORKDIR (Harbor's `[environment] workdir`). */
  workdir?: string;
  /** Paths that never enter the agent's sandbox (tests, solutions): staged for grading only. */
  hiddenPaths: string[];
  /** What the oracle does: run a solution folder's solve.sh, or write a reference program. */
  oracle:
    | { kind: 'script'; dir: string; env?: Record<string, string> }
    /** A script written to `path` and run with bash (Terminal-Bench's solution.sh or solution.yaml). */
    | { kind: 'shell'; path: string; script: string }
    | { kind: 'program'; path: string; content: string }
    | { kind: 'patch'; repoPath: string; patch: string }
    | undefined;
}

/**
 * A stored-name stem for what is built for one task (`task-hello-1a2b3c4d`): its id made a valid
 * environment name, plus a hash of where it was loaded from. Folder names alone collide: two
 * suites each with a `hello` task, or `Hello` and `hello` (names are lower case), would
 * otherwise share one environment and one would run in the other's image.
 */
export function taskStorageStem(prefix: string, task: Pick<Task, 'id' | 'source'>): string {
  const slug = task.id
    .toLowerCase()
    .replace(/[^a-z0-9._-]/g, '-')
    .slice(0, 40);
  const origin = createHash('sha256').update(task.source).digest('hex').slice(0, 8);
  return `${prefix}-${slug}-${origin}`;
}

/**
 * The longest any timeout of a task may be: a week. Longer is a typo or an attack (and past 24.8
 * days Node's timers fire at once, which would fail the episode later as something else).
 */
const MAX_TIMEOUT_SECONDS = 7 * 24 * 60 * 60;
export const MAX_TASK_TIMEOUT_MS = MAX_TIMEOUT_SECONDS * 1000;
const { maxCpu, minMemoryMib, maxMemoryMib, maxDiskMib } = SANDBOX_LIMITS;

/** A duration in ms, as a task's timeouts come to (fractional where seconds were). */
function milliseconds() {
  return z
    .number()
    .positive('must be more than 0 ms')
    .max(MAX_TASK_TIMEOUT_MS, `must be at most ${MAX_TASK_TIMEOUT_MS} ms (7 days)`);
}

/**
 * A task file's numbers, each with the range it must fall in. Every loader builds its format's
 * schema from these, so a value out of range is refused at load, naming the file, the field and
 * the range: the task author's error, never an infrastructure failure later.
 */
export const taskNumber = {
  cpus: () => z.number().positive('must be more than 0 CPUs').max(maxCpu, `must be at most ${maxCpu} CPUs`),
  memoryMib: () =>
    z
      .number()
      .int()
      .min(minMemoryMib, `must be at least ${minMemoryMib} MiB`)
      .max(maxMemoryMib, `must be at most ${maxMemoryMib} MiB (4 TiB)`),
  diskMib: () => z.number().int().positive().max(maxDiskMib, `must be at most ${maxDiskMib} MiB (1 PiB)`),
  timeoutSeconds: () =>
    z
      .number()
      .positive('must be more than 0 seconds')
      .max(MAX_TIMEOUT_SECONDS, `must be at most ${MAX_TIMEOUT_SECONDS} seconds (7 days)`),
  /** Whole milliseconds (a time limit an OJ problem sets). */
  timeoutMs: () => milliseconds().int(),
};

/** A task's numbers as every format comes to them (a task built in code included). */
const taskLimitsSchema = z.object({
  resources: z.object({
    cpu: taskNumber.cpus(),
    memoryMib: taskNumber.memoryMib(),
    diskMib: taskNumber.diskMib().optional(),
  }),
  agentTimeoutMs: milliseconds(),
  verifierTimeoutMs: milliseconds(),
  buildTimeoutMs: milliseconds().optional(),
});

/** Checks a task's numbers, however it was made; out of range is its author's error ({@link TaskError}). */
export function checkTaskLimits(task: Task): void {
  const checked = taskLimitsSchema.safeParse(task);
  if (!checked.success) throw new TaskError(task.id, `a limit is out of range: ${issuesText(checked.error)}`);
}

/**
 * A task graded in the agent's own sandbox (`verifierMode: 'shared'`) runs its tests beside the
 * processes the agent left there, so the tests' network is theirs too: it may be no wider than
 * the agent's own stage, or grading would hand the agent's processes what its stage denied (an
 * answer to download, a way to send the tests out). Refused, naming what to change.
 */
export function checkSharedGradingNetwork(task: Task): void {
  if (task.verifierMode !== 'shared') return;
  const agent = new Set(task.network.agent.map((rule) => rule.replace(/\?$/, '')));
  const wider = task.network.verify.filter((rule) => !agent.has(rule.replace(/\?$/, '')));
  if (wider.length)
    throw new TaskError(
      task.id,
      `it is graded in the agent's own sandbox (environment_mode "shared"), but its tests' network reaches what its agent's does not (${wider.join(', ')}), and the agent's processes would share it: give the verifier the agent's network mode, or grade in a fresh sandbox`,
    );
}
