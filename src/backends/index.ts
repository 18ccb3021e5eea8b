/** Backends: the sandbox contract and its implementations, plus the host plumbing they share. */
export { ContainerBackend } from './container/container-backend.ts';
export type { ContainerBackendOptions } from './container/container-backend.ts';
export type {
  Backend,
  BackendCapabilities,
  BackendName,
  BackendSandbox,
  CallOptions,
  DirEntry,
  ExecChunk,
  ExecOptions,
  ExecResult,
  ExecStream,
  GcReport,
  LayerImage,
  QosClass,
  ReadFileOptions,
  SandboxRecord,
  SandboxResources,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  WriteFileOptions,
} from './contract.ts';
