import type { SandboxAction, Task, TaskObservation } from '../env/index.ts';
import type { TokenUsage } from './episode-report.ts';

/** What a policy sees besides the observation. */
export interface AgentContext {
  task: Task;
  /** The episode this decision is for: an agent with memory keeps it per episode. */
  episodeId: string;
  stepIndex: number;
}

/** An action with what choosing it cost and said (an LLM agent's tokens and message). */
export interface AgentDecision {
  action: SandboxAction;
  usage?: TokenUsage;
  message?: string;
}

/** A policy: given what it sees, the next action (or a decision that carries one). */
export type Agent = ((
  observation: TaskObservation,
  context: AgentContext,
) => Promise<SandboxAction | AgentDecision>) & {
  /**
   * Set on the oracle: each episode's runner has the platform stage the task's solution for it
   * after the reset (`TaskEnv.stageSolution`), as Harbor does for its oracle; no other agent
   * ever sees one.
   */
  readonly isOracle?: boolean;
};

/** The decision an agent's answer comes to. */
export function decisionOf(answer: SandboxAction | AgentDecision): AgentDecision {
  return 'action' in answer ? answer : { action: answer };
}
