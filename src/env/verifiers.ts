import { SandgymError } from '../common/index.ts';
import type { Sandbox } from '../platform/index.ts';
import type { OjCase, Task } from './tasks/task.ts';
import { stageFolder } from './stage-folder.ts';

/** What a verifier works with: the grading sandbox (task layers plus the agent's diff). */
export interface VerifyContext {
  task: Task;
  grader: Sandbox;
  workdir: string;
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

function parseReward(text: string, json: boolean): number {
  if (!json) {
    const value = Number(text.trim());
    if (!Number.isFinite(value))
      throw new SandgymError('invalid_argument', `reward.txt holds "${text.trim()}", not a number`);
    return value;
  }
  const parsed = JSON.parse(text) as Record<string, unknown>;
  if (typeof parsed['reward'] === 'number') return parsed['reward'];
  const values = Object.values(parsed).filter((v): v is number => typeof v === 'number');
  if (values.length === 0) throw new SandgymError('invalid_argument', 'reward.json holds no number');
  return values.reduce((a, b) => a + b, 0) / values.length;
}

/**
 * Harbor: stages the task's tests at /tests (in the grader only), creates /logs/verifier empty,
 * runs /tests/test.sh, and reads reward.txt or reward.json over the agent channel.
 */
export function rewardFileVerifier(testsDir: string, timeoutMs: number): Verifier {
  return async ({ grader, workdir }) => {
    await stageFolder(grader, testsDir, '/tests');
    await grader.exec(['mkdir', '-p', '/logs/verifier']);
    const run = await grader.exec(['/tests/test.sh'], { timeoutMs, cwd: workdir });
    if (run.timedOut) throw new SandgymError('timeout', `The verifier ran out of its ${timeoutMs} ms`);
    const files = (await grader.listDir('/logs/verifier')).map((e) => e.name);
    const json = files.includes('reward.json');
    const reward =
      files.includes('reward.txt') || json
        ? parseReward(
            (
              await grader.readFile(json ? '/logs/verifier/reward.json' : '/logs/verifier/reward.txt')
            ).toString(),
            json,
          )
        : 0;
    return {
      reward,
      details: {
        exitCode: run.exitCode,
        output: `${run.stdout}${run.stderr}`.slice(-4000),
        rewardFile: files.includes('reward.txt') || json,
      },
    };
  };
}

/** Reward 1 when a command exits 0 in the grader, else 0. */
export function exitCodeVerifier(argv: string[], timeoutMs: number): Verifier {
  return async ({ grader, workdir }) => {
    const run = await grader.exec(argv, { timeoutMs, cwd: workdir });
    if (run.timedOut)
      throw new SandgymError('timeout', `The verifier command ran out of its ${timeoutMs} ms`);
    return { reward: run.exitCode === 0 ? 1 : 0, details: { exitCode: run.exitCode } };
  };
}

/** Output as judges compare it: trailing spaces on each line and trailing blank lines ignored. */
export function normaliseOutput(text: string): string {
  return text
    .split('\n')
    .map((line) => line.replace(/\s+$/, ''))
    .join('\n')
    .replace(/\n+$/, '');
}

/** OJ: runs the program once per case with its stdin and a time limit; reward 1 only when every case matches. */
export function ojVerifier(run: string[], cases: OjCase[], caseTimeoutMs: number): Verifier {
  return async ({ grader, workdir }) => {
    const statuses: string[] = [];
    for (const testCase of cases) {
      const result = await grader.exec(run, {
        stdin: testCase.stdin,
        timeoutMs: caseTimeoutMs,
        cwd: workdir,
      });
      statuses.push(
        result.timedOut
          ? 'time_limit'
          : result.oomKilled
            ? 'memory_limit'
            : result.exitCode !== 0
              ? 'runtime_error'
              : normaliseOutput(result.stdout) === normaliseOutput(testCase.stdout)
                ? 'accepted'
                : 'wrong_answer',
      );
    }
    const passed = statuses.filter((s) => s === 'accepted').length;
    return {
      reward: passed === cases.length ? 1 : 0,
      details: { cases: statuses, passed, total: cases.length },
    };
  };
}

/** A verifier from a plain function of the context. */
export function customVerifier(decide: (context: VerifyContext) => Promise<VerifierResult>): Verifier {
  return (context) => decide(context);
}

/** The verifier a task's format calls for. */
export function defaultVerifier(task: Task): Verifier {
  const grading = task.grading;
  return grading.kind === 'reward_file'
    ? rewardFileVerifier(grading.testsDir, task.verifierTimeoutMs)
    : ojVerifier(grading.run, grading.cases, grading.caseTimeoutMs);
}
