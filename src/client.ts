/**
 * `sandgym/client`: what a job needs to drive sandboxes on a remote sandgym (a node agent or a
 * controller) and nothing that runs them, so it works without root, the agent binary or any
 * host package. Sandboxes, gym environments over them, rollouts and evaluation all take the
 * {@link PlatformClient} that {@link connect} returns.
 *
 * @example
 * ```ts
 * import { connect, SandboxEnv } from 'sandgym/client';
 *
 * const platform = await connect('grpc://controller:7443', { token: process.env.SANDGYM_TOKEN! });
 * try {
 *   const sandbox = await platform.createSandbox({ environment: 'debian:bookworm' });
 *   console.log((await sandbox.exec(['uname', '-a'])).stdout);
 * } finally {
 *   await platform.close(); // Node 24 and later: `await using platform = ...` instead
 * }
 * ```
 */
import { Platform, type ConnectOptions, type RemotePlatform } from './platform/index.ts';

export { readTlsFiles } from './platform/index.ts';
export type { TlsFiles, TlsPaths } from './platform/index.ts';

/**
 * A client of the sandgym at `url` (`grpc://host:port`, or `grpc://ip:port,ip:port` for
 * controller replicas), authenticated by `options.token`.
 */
export function connect(url: string, options: ConnectOptions): Promise<RemotePlatform> {
  return Platform.connect(url, options);
}

export { SANDGYM_ERROR_CODES, SandgymError, isSandgymError } from './common/index.ts';
export type { FailureReason, SandgymErrorCode } from './common/index.ts';
export type {
  BackendName,
  CallOptions,
  CheckpointOptions,
  DirEntry,
  DirListing,
  ExecOptions,
  ExecResult,
  ExecStream,
  SandboxCheckpoint,
  SandboxRecord,
  SandboxState,
  SandboxStats,
} from './backends/index.ts';
export type {
  ConnectOptions,
  ForkOptions,
  PlatformClient,
  RemotePlatform,
  Run,
  RunOptions,
  Sandbox,
  SandboxLayer,
  SandboxRequest,
} from './platform/index.ts';
export { SandboxEnv, VectorEnv } from './env/index.ts';
export type {
  Environment,
  ResetInfo,
  SandboxAction,
  SandboxEnvOptions,
  SandboxObservation,
  StepInfo,
  StepResult,
} from './env/index.ts';
export { RolloutRunner, evaluate, openAiAgent, scriptedAgent } from './rollout/index.ts';
export type { Agent, EpisodeReport, EvaluateOptions } from './rollout/index.ts';
