/** Backends: the sandbox contract and its implementations, plus the host plumbing they share. */
export { ContainerBackend } from './container/container-backend.ts';
export { FnCallBackend } from './fncall/fncall-backend.ts';
export { VmBackend } from './vm/vm-backend.ts';
export { ensureGuestKernel } from './vm/guest-kernel.ts';
export { ensureVmImage } from './vm/vm-image.ts';
export { accelerator } from './vm/qemu.ts';
export type { VmBackendOptions } from './vm/vm-backend.ts';
export type { VmSandbox } from './vm/vm-sandbox.ts';
export type { VmSnapshot } from './vm/snapshots.ts';
export type { FnCallBackendOptions } from './fncall/fncall-backend.ts';
export type { ContainerBackendOptions } from './container/container-backend.ts';
export type { WarmPoolPolicy } from './container/warm-pool.ts';
export type { VolumeRoom } from './host/scratch-volume.ts';
export { BACKEND_NAMES } from './contract.ts';
export type {
  Backend,
  BackendCapabilities,
  BackendName,
  BackendSandbox,
  CallOptions,
  DirEntry,
  DirListing,
  ExecChunk,
  ExecOptions,
  ExecResult,
  ExecStream,
  GcReport,
  HibernateOptions,
  HibernateReport,
  ListDirOptions,
  CheckpointOptions,
  SandboxCheckpoint,
  LayerImage,
  LayerVerification,
  LoadMode,
  QosClass,
  ReadFileOptions,
  SandboxRecord,
  SandboxResources,
  SandboxLifetime,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  NetworkRecord,
  StepCounters,
  WriteFileOptions,
  WrittenPathsOptions,
} from './contract.ts';
export { collectExec } from './collect-exec.ts';
export { recordText } from './network-record.ts';
export { callOptionsOf } from './call-options.ts';
export { isRootUser } from './internal/users.ts';
export { buildErofsImage } from './host/erofs.ts';
export { MAX_LISTED as PACK_REPORT_MAX_ENTRIES } from './host/diff-filter.ts';
export type { DiffFilter, DroppedEntry, FilterReport } from './host/diff-filter.ts';
export { buildBusyboxRootfs, buildDebianRootfs } from './host/base-rootfs.ts';
export type { DebianRootfsOptions } from './host/base-rootfs.ts';
export { runProgram } from './host/run-program.ts';
export { unzstd } from './host/unzstd.ts';
export { GroupNetwork } from './host/group-network.ts';
export { BENCHMARK_PROGRAMS, TEST_PROGRAMS, installPrograms, prepareHost } from './host/host-setup.ts';
export type { HostReport } from './host/host-setup.ts';
export { agentBinaryPath, defaultDataDir, hostProgram, packageRoot } from './host/paths.ts';
export { prepareDataFolder } from './host/data-folder.ts';
export { isAlive, processIdentity, startDetachedNode } from './host/processes.ts';
export type { ProcessIdentity } from './host/processes.ts';
export { detectCgroupLayout } from './host/cgroups.ts';
export { sha256OfFile } from './host/layer-verify.ts';
export { hostAvailableMib } from './host/memory.ts';
export { activeSwapAreas, ensureSwapFile, removeSwapFile } from './host/swap.ts';
export type { SwapArea } from './host/swap.ts';
export { defaultRuleBook, hostDebianMirrorRules, readNetworkRules } from './host/network-rules.ts';
export type { NetworkRuleBook } from './host/network-rules.ts';
export { MAX_GRANT_RULES, checkNetworkGrant, grantedRules } from './host/network-grants.ts';
export type { NetworkGrant } from './host/network-grants.ts';
export type { CriuSupport } from './host/criu.ts';
export { ensureCriu } from './host/criu-build.ts';
