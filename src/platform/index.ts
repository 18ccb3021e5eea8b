/** The platform: layer store, environments, and the client that creates sandboxes. */
export { Platform, LocalPlatform, defaultProject, defaultStoreDir } from './local-platform.ts';
export { defaultDataDir } from '../backends/index.ts';
export type { ImageSources, LocalPlatformOptions } from './local-platform.ts';
export { hostPlatformOf } from './host-platform.ts';
export type { HostPlatform, SandboxGroupNetwork } from './host-platform.ts';
export { imageSourcesFromEnv } from './local-platform.ts';
export { RemotePlatform } from './remote-platform.ts';
export type { ConnectOptions } from './remote-platform.ts';
export { NodeAgent } from './node/node-agent.ts';
export type { PhaseOptions, PhaseReport, Run, RunOptions, RunStatus, TrainingPhase } from './runs.ts';
export { DEFAULT_PROJECT, PROJECT_LABEL } from './runs.ts';
export type { NodeAgentOptions, ProjectLimits, ServedService } from './node/node-agent.ts';
export type { NodeEtcdOptions } from './etcd/node-cluster-link.ts';
export {
  ENVS,
  NODE,
  WireClient,
  chatOptions,
  envSpecSchema,
  networkGrantOf,
  quotaOf,
  readTlsFiles,
  register,
  SANDBOXES,
  WireServer,
  tokenAuthenticator,
} from './wire/index.ts';
export type {
  CallContext,
  ChatOptions,
  DrainProgress,
  EnvSpec,
  Handlers,
  IdResolvers,
  NodeStatus,
  Registration,
  SandboxInfo,
  TlsFiles,
  TlsPaths,
} from './wire/index.ts';
export { checkEtcdEndpoints, connectEtcd } from './etcd/etcd-connection.ts';
export type { EtcdClient } from './etcd/etcd-connection.ts';
export { NodeMembership } from './etcd/node-membership.ts';
export type { NodeRecord } from './etcd/node-membership.ts';
export { ProjectQuotaLedger } from './etcd/project-quota.ts';
export type { EtcdOptions } from './etcd/etcd-connection.ts';
export { Controller } from './controller/controller.ts';
export { readGrantsFile, reloadGrantsOnHangup } from './controller/grants-file.ts';
export type { ControllerOptions, ProjectGrant } from './controller/controller.ts';
export { Placer } from './controller/placement.ts';
export type { Demand, NodeLoad } from './controller/placement.ts';
export { isDiffLargerThanDisk } from './platform-client.ts';
export type {
  ForkOptions,
  LayerGcOptions,
  LayerGcReport,
  PackDiffOptions,
  PackDiffResult,
  PlatformClient,
  Sandbox,
  SandboxGroup,
  SandboxLayer,
} from './platform-client.ts';
export { LayerStore, ProjectStore, parseEnvironmentRef } from './store/layer-store.ts';
export type { Environment, EnvironmentInput, LayerManifest } from './store/layer-store.ts';
export { ensureBaseEnvironments, DEFAULT_ENVIRONMENT, standInFor } from './store/base-environments.ts';
export { SANDBOX_LIMITS, sandboxRequestSchema } from './sandbox-request.ts';
export { checkHostName } from './runtime-files.ts';
export type { SandboxRequest, ResolvedSandboxRequest } from './sandbox-request.ts';
export { buildLayerFromTar } from './layer-build/from-archive.ts';
export type {
  BuildStep,
  DockerfileBuildOptions,
  DockerfileBuildResult,
} from './layer-build/dockerfile-build.ts';
export { buildLayerFromOci } from './layer-build/from-oci.ts';
export type { OciBuildResult } from './layer-build/from-oci.ts';
export { pullImage } from './layer-build/from-registry.ts';
export type { PulledImage, RegistryOptions } from './layer-build/from-registry.ts';
export { parseImageReference } from './layer-build/image-reference.ts';
export type { ImageReference } from './layer-build/image-reference.ts';
export { TrajectoryLog } from './trajectory-log.ts';
export type { TrajectoryRecord } from './trajectory-log.ts';
export { lookupStep, sameValue } from './exactly-once.ts';
export type { StepKey, StepLog, StepLookup } from './exactly-once.ts';
export { MAX_COMMAND_TIMEOUT_MS, sandboxActionSchema } from './steps/actions.ts';
export type { InvalidAction, SandboxAction, SandboxObservation, StepAction } from './steps/actions.ts';
export { stepActionOf } from './steps/step-action.ts';
export type { LimitHit, StepSignals } from './steps/step-signals.ts';
export type {
  StepAudit,
  StepOptions,
  StepOutcome,
  StepRecordResult,
  StepReply,
  StepRequest,
} from './steps/step-types.ts';
