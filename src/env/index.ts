/** The gym layer: the Environment contract and environments over sandboxes. */
export { SandboxEnv } from './sandbox-env.ts';
export type { SandboxEnvOptions } from './sandbox-env.ts';
export { sandboxActionSchema } from './sandbox-actions.ts';
export type { SandboxAction, SandboxObservation } from './sandbox-actions.ts';
export { withStepLimit } from './wrappers.ts';
export { TaskEnv, stageFolder } from './task-env.ts';
export type { Grade, TaskObservation } from './task-env.ts';
export { loadHarborTask, loadTasks } from './tasks/harbor.ts';
export type { Task } from './tasks/task.ts';
export type {
  EnvCallOptions,
  Environment,
  ResetOptions,
  ResetResult,
  StepOutcome,
  StepResult,
} from './environment.ts';
