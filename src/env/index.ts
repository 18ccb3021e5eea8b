/** The gym layer: the Environment contract and environments over sandboxes. */
export { SandboxEnv } from './sandbox-env.ts';
export type { SandboxEnvOptions } from './sandbox-env.ts';
export { sandboxActionSchema } from './sandbox-actions.ts';
export type { SandboxAction, SandboxObservation } from './sandbox-actions.ts';
export { withStepLimit } from './wrappers.ts';
export type {
  EnvCallOptions,
  Environment,
  ResetOptions,
  ResetResult,
  StepOutcome,
  StepResult,
} from './environment.ts';
