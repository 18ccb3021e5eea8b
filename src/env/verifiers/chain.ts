import { SandgymError } from '../../common/index.ts';
import type { PlatformClient, Sandbox } from '../../platform/index.ts';
import type { Deadline } from '../deadline.ts';
import type { Task } from '../tasks/task.ts';
import type { PhaseClock } from '../episode-timings.ts';

/** What a verifier works with: the grading sandbox (task layers plus the agent's diff). */
export interface VerifyContext {
  task: Task;
  grader: Sandbox;
  workdir: string;
  /** The platform, for verifiers that run calls of their own (OJ judges through FnCall). */
  platform: PlatformClient;
  /** The clean environment the grader was built on, without the agent's changes. */
  environment: string;
  /** That environment's own variables (its image's ENV), under the task's. */
  imageEnv: Record<string, string>;
  /** What is left of the grading's time: every call in the grader takes its timeout from it. */
  deadline: Deadline;
  /**
   * The user the task's tests run as (its verifier user, else its image's USER); absent: root.
   * The grader's own steps (staging, reading the reward) run as root.
   */
  user?: string;
  /** The episode's clock, which counts the test command's own time apart from the grading's. */
  clock?: PhaseClock;
}

/** Runs a verifier's test command, its time counted as the tests' own. */
export function timedTests<T>(context: Pick<VerifyContext, 'clock'>, run: () => Promise<T>): Promise<T> {
  return context.clock ? context.clock.time('tests', run) : run();
}

/** Exec options that run a command as the tests' user; /logs/verifier is theirs to write. */
export async function asTestUser(
  grader: Sandbox,
  user: string | undefined,
  deadline: Deadline,
): Promise<{ user?: string }> {
  if (!user) return {};
  const chown = await grader.exec(['chown', '-R', user, '/logs/verifier'], deadline.call());
  if (chown.exitCode !== 0)
    throw new SandgymError(
      'invalid_argument',
      `The tests are to run as "${user}", which the image does not know: ${chown.stderr.trim()}`,
    );
  return { user };
}

/**
 * A verifier run that went wrong in a way either side could have caused: the tests ran out of
 * time, the reward is missing or not a number in range, the runner never reported. The agent's
 * code runs inside the tests, so it can hang them or write a bad reward; a broken verifier does
 * the same. The grader tells them apart by running the verifier again without the agent's
 * changes (see TaskEnv.grade): if that run is sound, the agent's changes caused it and the
 * episode scores 0; if it fails too, the verifier is at fault (`verifier_error`).
 */
export class GradingAnomaly extends SandgymError {
  constructor(
    readonly kind:
      | 'timeout'
      | 'no_reward'
      | 'bad_reward'
      | 'no_report'
      | 'killed'
      | 'runner_ended_early'
      | 'forged_report'
      | 'forged_output'
      | 'harness_rewired'
      | 'run_interrupted'
      | 'decided_by_code_under_test'
      | 'reward_contradicts_tests'
      | 'reward_file_unnamed',
    message: string,
    /**
     * What the run would have scored, for an anomaly that a verifier may show by habit (a reward
     * its own tests contradict): when the run without the agent's changes shows the same
     * anomaly, it is the verifier's way and this verdict stands.
     */
    readonly verdict?: VerifierResult,
  ) {
    super('failed_precondition', message);
  }

  /** The end of what the test run printed, when the anomaly came from one (see {@link judgeRun}). */
  output?: { stdoutTail: string; stderrTail: string };
}

/**
 * Ends every process a verifier's run left in the grader (a daemon the code under test started
 * could otherwise rewrite the reward file between the run's end and its reading). The sandbox
 * agent is its namespace's pid 1, which `kill -1` never reaches.
 */
export async function endLeftoverProcesses(grader: Sandbox, deadline: Deadline): Promise<void> {
  await grader.exec(['sh', '-c', 'kill -KILL -1 2>/dev/null; exit 0'], deadline.call());
}

/** A verifier's verdict: the reward and what led to it. */
export interface VerifierResult {
  reward: number;
  details: Record<string, unknown>;
}

/** An interceptor: it may decide, or call `next` and adjust what the rest decided. */
export type Verifier = (
  context: VerifyContext,
  next: () => Promise<VerifierResult>,
) => Promise<VerifierResult>;

/** Runs the chain in order; the last verifier's `next` fails, since no one decided. */
export function runVerifiers(
  verifiers: readonly Verifier[],
  context: VerifyContext,
): Promise<VerifierResult> {
  const at = (index: number): Promise<VerifierResult> => {
    const verifier = verifiers[index];
    if (!verifier)
      return Promise.reject(
        new SandgymError('failed_precondition', `No verifier decided a reward for task ${context.task.id}`),
      );
    return verifier(context, () => at(index + 1));
  };
  return at(0);
}

/** A verifier from a plain function of the context. */
export function customVerifier(decide: (context: VerifyContext) => Promise<VerifierResult>): Verifier {
  return (context) => decide(context);
}

/** How much of a verifier's output the report keeps, per stream: its end, where the verdict is. */
const OUTPUT_TAIL_CHARS = 4000;

/** The ends of a verifier run's stdout and stderr, for the report. */
/**
 * Judges what a test run left with `judge`: an anomaly it finds carries the run's output tails,
 * so a `verifier_error` can show the verifier's own words.
 */
export async function judgeRun<T>(
  run: { stdout: string; stderr: string },
  judge: () => T | Promise<T>,
): Promise<T> {
  try {
    return await judge();
  } catch (error) {
    if (error instanceof GradingAnomaly) error.output ??= outputTails(run);
    throw error;
  }
}

export function outputTails(run: { stdout: string; stderr: string }): {
  stdoutTail: string;
  stderrTail: string;
} {
  return {
    stdoutTail: run.stdout.slice(-OUTPUT_TAIL_CHARS),
    stderrTail: run.stderr.slice(-OUTPUT_TAIL_CHARS),
  };
}
