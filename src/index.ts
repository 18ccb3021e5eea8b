/**
 * sandgym's front door: the platform, its sandboxes, the gym environments over them, and the
 * rollout and evaluation drivers. Everything a training or evaluation job needs is here; the
 * layers below (backends, node and controller servers, the wire) are the platform's own.
 *
 * @example
 * ```ts
 * import { Platform, SandboxEnv } from 'sandgym';
 *
 * const platform = await Platform.local();
 * try {
 *   const sandbox = await platform.createSandbox({ environment: 'debian:bookworm' });
 *   console.log((await sandbox.exec(['python3', '-c', 'print(6*7)'])).stdout);
 * } finally {
 *   await platform.close(); // Node 24 and later: `await using platform = ...` instead
 * }
 * ```
 *
 * The package is ESM-only (README.md, "From TypeScript"): it has no CommonJS entry.
 */
export { SANDGYM_ERROR_CODES, SandgymError, isSandgymError } from './common/index.ts';
export type { FailureReason, SandgymErrorCode } from './common/index.ts';
export type {
  BackendName,
  CallOptions,
  CheckpointOptions,
  DirEntry,
  DirListing,
  ExecChunk,
  ExecOptions,
  ExecResult,
  ExecStream,
  HibernateReport,
  QosClass,
  ReadFileOptions,
  SandboxCheckpoint,
  SandboxRecord,
  SandboxResources,
  SandboxState,
  SandboxStats,
  NetworkRecord,
  WriteFileOptions,
} from './backends/index.ts';
export { BACKEND_NAMES } from './backends/index.ts';
export { Platform, defaultDataDir, readTlsFiles } from './platform/index.ts';
export type {
  ConnectOptions,
  Environment as EnvironmentImage,
  ForkOptions,
  LocalPlatform,
  LocalPlatformOptions,
  PackDiffOptions,
  PackDiffResult,
  PlatformClient,
  RemotePlatform,
  Run,
  RunOptions,
  Sandbox,
  SandboxGroup,
  SandboxLayer,
  SandboxRequest,
  TlsFiles,
  TlsPaths,
  TrainingPhase,
} from './platform/index.ts';
export {
  ChatEnv,
  DEFAULT_REWARD_RANGE,
  GradingAnomaly,
  SandboxEnv,
  TaskEnv,
  VectorEnv,
  customVerifier,
  defaultVerifier,
  exitCodeVerifier,
  loadTasks,
  ojVerifier,
  parseReward,
  rewardFileVerifier,
  runVerifiers,
  sweBenchVerifier,
  testLogVerifier,
} from './env/index.ts';
export type {
  AssistantMessage,
  ChatEnvOptions,
  ChatMessage,
  ChatResetInfo,
  ChatStepInfo,
  ChatStepOptions,
  Environment,
  Grade,
  ResetInfo,
  ResetResult,
  SandboxAction,
  SandboxEnvOptions,
  SandboxObservation,
  StepInfo,
  StepResult,
  StepSignals,
  Task,
  TaskEnvOptions,
  TaskResetInfo,
  TaskStepInfo,
  Verifier,
  VerifierResult,
  VerifyContext,
  VectorEnvOptions,
} from './env/index.ts';
export {
  AgentError,
  BUILT_IN_AGENTS,
  PREEMPTION_SIGNALS,
  RolloutRunner,
  TrainingCoordinator,
  evaluate,
  openAiAgent,
  scriptedAgent,
  toAtif,
} from './rollout/index.ts';
export type {
  Agent,
  AgentContext,
  AgentDecision,
  EpisodeReport,
  EvaluateOptions,
  LeaseEvent,
  LifecycleEvent,
  OpenAiAgentOptions,
  PhaseEvent,
  StepEvent,
  TrainingCoordinatorOptions,
  TrainingEvent,
} from './rollout/index.ts';
