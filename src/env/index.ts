/** The gym layer: the Environment contract and environments over sandboxes. */
export { SandboxEnv } from './sandbox-env.ts';
export type { LimitHit, StepAudit, StepSignals } from '../platform/index.ts';
export type {
  CheckpointRef,
  DiskCheckpointRef,
  MemoryCheckpointRef,
  RestoredInfo,
  SandboxEnvOptions,
} from './sandbox-env.ts';
export { stepActionOf } from '../platform/index.ts';
export type { InvalidAction, SandboxAction, SandboxObservation, StepAction } from '../platform/index.ts';
export { withStepLimit } from './wrappers.ts';
export { VectorEnv } from './vector-env.ts';
export { comparableObservation, replayTrajectory } from './replay.ts';
export type { ReplayReport } from './replay.ts';
export type { AutoresetMode, VectorEnvOptions, VectorStepResult } from './vector-env.ts';
export { TaskEnv } from './task-env.ts';
export { EPISODE_PHASES, overheadMs } from './episode-timings.ts';
export type { EpisodePhase, EpisodeTimings } from './episode-timings.ts';
export { oraclePlan } from './oracle-plan.ts';
export { PROTECTED_PATHS } from './grading-scope.ts';
export type { GradingScope } from './grading-scope.ts';
export type {
  Grade,
  TaskCheckpoint,
  TaskEnvOptions,
  TaskObservation,
  TaskResetInfo,
  TaskStepInfo,
} from './task-env.ts';
export { filesUnder } from './stage-folder.ts';
export { loadHarborTask } from './tasks/harbor.ts';
export { loadTasks } from './tasks/load-tasks.ts';
export type { LoadTasksOptions } from './tasks/load-tasks.ts';
export { parsePytestSummary } from './pytest-summary.ts';
export { loadSweBenchFile } from './tasks/swebench.ts';
export type {
  NetworkPolicy,
  OjCase,
  Task,
  TaskEnvironmentSource,
  TaskGrading,
  TaskHealthcheck,
  TaskMcpServer,
  TaskService,
  VerifierMode,
} from './tasks/task.ts';
export { PUBLIC_NETWORK, TaskError, taskStorageStem } from './tasks/task.ts';
export {
  DEFAULT_REWARD_RANGE,
  GradingAnomaly,
  customVerifier,
  defaultVerifier,
  parseReward,
  exitCodeVerifier,
  normaliseOutput,
  ojVerifier,
  rewardFileVerifier,
  runVerifiers,
  sweBenchVerifier,
  testLogVerifier,
} from './verifiers/index.ts';
export type { Verifier, VerifierResult, VerifyContext } from './verifiers/index.ts';
export type {
  EnvCallOptions,
  Environment,
  ResetInfo,
  ResetOptions,
  ResetResult,
  StepInfo,
  StepOutcome,
  StepResult,
} from './environment.ts';
export { envService } from './env-service.ts';
export type { EnvServiceOptions } from './env-service.ts';
export { networkReportOf, networkReportText } from './network-report.ts';
export type { NetworkReport } from './network-report.ts';
export { ChatEnv } from './chat/chat-env.ts';
export type {
  ChatCallRecord,
  ChatEnvOptions,
  ChatMessage,
  ChatProgress,
  ChatResetInfo,
  ChatStepInfo,
  ChatStepOptions,
} from './chat/chat-env.ts';
export { CHAT_TOOLS, CHAT_TOOL_NAMES, actionOfToolCall } from './chat/tools.ts';
export type { ChatTool } from './chat/tools.ts';
export { MAX_ANSWER_CHARS, MAX_CALLS_PER_ANSWER } from './chat/parse-calls.ts';
export type { AssistantMessage, ToolCallFormat, ToolCallParser } from './chat/parse-calls.ts';
export { observationText } from './chat/observation-text.ts';
