/** Verifiers: what turns a graded sandbox into a reward, one module per task format. */
import type { Task } from '../tasks/task.ts';
import type { Verifier } from './chain.ts';
import { ojVerifier } from './oj.ts';
import { rewardFileVerifier } from './reward-file.ts';
import { sweBenchVerifier } from './swebench.ts';
import { testLogVerifier } from './test-log.ts';

export { GradingAnomaly, customVerifier, runVerifiers } from './chain.ts';
export type { Verifier, VerifierResult, VerifyContext } from './chain.ts';
export { DEFAULT_REWARD_RANGE, parseReward, rewardFileVerifier } from './reward-file.ts';
export { testLogVerifier } from './test-log.ts';
export { exitCodeVerifier, normaliseOutput, ojVerifier } from './oj.ts';
export { sweBenchVerifier } from './swebench.ts';

/** The verifier a task's format calls for. */
export function defaultVerifier(task: Task): Verifier {
  const grading = task.grading;
  switch (grading.kind) {
    case 'reward_file':
      return rewardFileVerifier(grading.testsDir, task.verifierTimeoutMs);
    case 'test_log':
      return testLogVerifier(grading, task.verifierTimeoutMs);
    case 'oj':
      return ojVerifier(grading.program, grading.run, grading.cases, grading.caseTimeoutMs);
    case 'swebench':
      return sweBenchVerifier(grading, task.verifierTimeoutMs);
  }
}
