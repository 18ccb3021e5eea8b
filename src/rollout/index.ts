/** Rollouts and batch evaluation over task environments. */
export {
  AgentError,
  BUILT_IN_AGENTS,
  decisionOf,
  modelOfAgent,
  nopAgent,
  oracleAgent,
  resolveAgent,
  scriptedAgent,
} from './agents.ts';
export type { Agent, AgentContext, AgentDecision, ModelEndpoint, ResolvedAgent } from './agents.ts';
export { openAiAgent } from './llm-agent.ts';
export type { OpenAiAgentOptions } from './llm-agent.ts';
export { atifTrajectorySchema, toAtif, writeAtif } from './atif.ts';
export type { AtifAgent, AtifTrajectory } from './atif.ts';
export { evaluate } from './evaluate.ts';
export type { EvaluateOptions } from './evaluate.ts';
export type { EpisodeReport, EvalProgress, LifecycleEvent, StepEvent, TokenUsage } from './episode-report.ts';
export { RolloutRunner } from './rollout-runner.ts';
export type { RewardEvent } from './rollout-runner.ts';
export { checkTask } from './check-task.ts';
export type { CheckResult } from './check-task.ts';
export { EvalJournal } from './eval-journal.ts';
export { renderHtmlReport } from './html-report.ts';
export { PREEMPTION_SIGNALS, TrainingCoordinator, leaseRenewals } from './training.ts';
export type {
  KeepAliveOptions,
  LeaseEvent,
  PhaseEvent,
  TrainingCoordinatorOptions,
  TrainingEvent,
} from './training.ts';
export { observationText } from './observation-text.ts';
export { ModelProxy } from './model-proxy.ts';
export type { ModelProxyOptions } from './model-proxy.ts';
export type { ModelTurn } from './model-turn.ts';
