/** The platform: layer store, environments, and the client that creates sandboxes. */
export { Platform, LocalPlatform, defaultDataDir, defaultStoreDir } from './local-platform.ts';
export type { LocalPlatformOptions } from './local-platform.ts';
export type {
  LayerGcOptions,
  LayerGcReport,
  PackDiffOptions,
  PackDiffResult,
  PlatformClient,
  Sandbox,
} from './platform-client.ts';
export { LayerStore, parseEnvironmentRef } from './layer-store.ts';
export type { Environment, EnvironmentInput, LayerManifest } from './layer-store.ts';
export { ensureBaseEnvironments, DEFAULT_ENVIRONMENT } from './base-environments.ts';
export { MIN_MEMORY_MIB } from './sandbox-request.ts';
export type { SandboxRequest, ResolvedSandboxRequest } from './sandbox-request.ts';
export { buildLayerFromTar } from './layer-build/from-archive.ts';
export type {
  BuildStep,
  DockerfileBuildOptions,
  DockerfileBuildResult,
} from './layer-build/dockerfile-build.ts';
export { buildLayerFromOci } from './layer-build/from-oci.ts';
export type { OciBuildResult } from './layer-build/from-oci.ts';
export { TrajectoryLog } from './trajectory-log.ts';
export type { TrajectoryRecord } from './trajectory-log.ts';
export { ExactlyOnceSteps } from './exactly-once.ts';
export type { StepRequest } from './exactly-once.ts';
