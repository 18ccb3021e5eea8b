import type {
  CallOptions,
  DroppedEntry,
  GcReport,
  SandboxCheckpoint,
  SandboxRecord,
} from '../backends/index.ts';
import { isSandgymError } from '../common/index.ts';
import type { Environment, LayerManifest } from './store/layer-store.ts';
import type { SandboxRequest } from './sandbox-request.ts';
import type { StepLog } from './exactly-once.ts';
import type { Sandbox } from './sandbox.ts';
import type { StepReply, StepRequest } from './steps/step-types.ts';
import type { Run, RunOptions } from './runs.ts';

export type { Sandbox, SandboxLayer } from './sandbox.ts';

/**
 * What every way of running sandgym offers: the embedded platform in this process today, the
 * cluster client later. Layers above see only this.
 */
export interface PlatformClient extends AsyncDisposable {
  createSandbox(request?: SandboxRequest, options?: CallOptions): Promise<Sandbox>;
  listSandboxes(options?: CallOptions): Promise<SandboxRecord[]>;
  /**
   * A handle on a live sandbox by id, e.g. for a trainer that restarted. Closing it destroys
   * the sandbox; closing the platform does not. Missing (or another project's) is `not_found`.
   */
  attachSandbox(id: string, options?: CallOptions): Promise<Sandbox>;
  killSandbox(id: string, options?: CallOptions): Promise<void>;
  /** Removes what crashed owners left behind. */
  gc(options?: CallOptions): Promise<GcReport>;
  /**
   * Unmounts unused layer mounts, drops unused node-local copies, and deletes store layers that
   * no environment or live sandbox references, once older than `minAgeMs` (default one hour).
   */
  layerGc(options?: LayerGcOptions): Promise<LayerGcReport>;
  listEnvironments(options?: CallOptions): Promise<Environment[]>;
  /** One environment, "name:version"; `not_found` names the ones there are. */
  getEnvironment(ref: string, options?: CallOptions): Promise<Environment>;
  /**
   * pack_diff: turns what a sandbox wrote into a new layer, and records `name` as an environment
   * that is the sandbox's own stack plus that layer. New sandboxes of it start where this one is.
   * Takes a handle, or the id of a sandbox on this node that another process owns. Fails with
   * `resource_exhausted`: not retryable when the sandbox's changes are larger than its disk cap
   * or their layer than the project's whole store quota (see {@link isDiffLargerThanDisk}),
   * retryable when its project's store quota is used up.
   */
  packDiff(sandbox: Sandbox | string, options: PackDiffOptions): Promise<PackDiffResult>;
  /**
   * The step log of a sandbox, kept where the sandbox runs: every recorded step, for audits,
   * replays and reports. A sandbox of another project is `not_found`.
   */
  stepLog(sandboxId: string, options?: CallOptions): Promise<StepLog>;
  /**
   * One step of an episode, in one round trip: where the sandbox runs, the step is looked up in
   * its log, run, audited and recorded before the answer. A step already recorded answers with its
   * record; one still running is waited for; one that started on a node process that died is
   * `step_in_doubt`. A cancelled call stops waiting; the step still ends and is recorded.
   */
  step(sandbox: Sandbox, request: StepRequest, options?: CallOptions): Promise<StepReply>;
  /**
   * Starts a run (or rejoins one of the same name): sandboxes created with `run: name` belong to
   * it, its lease pauses them when the trainer stops renewing, and its phases steer them.
   */
  startRun(options: RunOptions): Promise<Run>;
  /**
   * fork(n) for group rollouts: n sandboxes from `sandbox`'s current state, admitted all or
   * nothing and cleaned up together. At `depth: 'disk'` (the default) they start from its files
   * and may land on any node; at `depth: 'memory'` they carry on from its processes and memory
   * too, on its node (microVMs, VMs, and containers where CRIU works). Each copy has its own
   * value in /run/sandgym/fork and SANDGYM_FORK (for commands started after the fork) to reseed
   * from: processes that were running keep the source's random state (docs/training.md).
   */
  fork(sandbox: Sandbox, count: number, options?: ForkOptions): Promise<SandboxGroup>;
  /** Destroys this client's sandboxes. Idempotent. */
  close(): Promise<void>;
}

/** Options for {@link PlatformClient.fork}. */
export interface ForkOptions extends CallOptions {
  /** What the copies start from: the source's files, or its processes and memory too. @default 'disk' */
  depth?: 'disk' | 'memory';
  /**
   * With `depth: 'memory'`: start the copies from this earlier checkpoint of the sandbox (see
   * `sandbox.checkpoint()`) rather than from a fresh one; a restore as new sandboxes.
   */
  checkpoint?: SandboxCheckpoint | string;
}

/** Sandboxes forked together, cleaned up together. */
export interface SandboxGroup extends AsyncDisposable {
  readonly sandboxes: readonly Sandbox[];
  /** Destroys every sandbox of the group. */
  close(): Promise<void>;
}

/** Options for {@link PlatformClient.packDiff}. */
export interface PackDiffOptions extends CallOptions {
  /**
   * The new environment, "name:version". Without it only the layer is made (nothing refers to
   * it, so layer gc reclaims it once it is old): what a grader stacks for one episode.
   */
  name?: string;
  description?: string;
  /**
   * Paths (relative to /) left out of the layer, with everything below them, and with any
   * ancestor of theirs the sandbox replaced by something that is not a folder (a symlink in place
   * of /usr/local, say); an ancestor it emptied and made again shows the layers below it again.
   */
  excludePaths?: string[];
  /** Regular expressions over paths (relative to /) left out of the layer. */
  excludeRegexes?: string[];
  /** Paths (relative to /) whose presence in the sandbox's changes is reported in `present`. */
  reportPaths?: string[];
  /**
   * Paths (relative to /) that only a grader will hold: symlinks of the changes that lead into
   * them (as the sandbox resolves them) are left out and listed in `dropped`.
   */
  hiddenPaths?: string[];
}

/**
 * Whether `error` is packDiff's refusal of changes that can never be packed: larger than their
 * sandbox's disk cap by their apparent size (sparse files count whole), or a layer larger than
 * the project's whole store quota. The sandbox's own doing, which no retry changes.
 */
export function isDiffLargerThanDisk(error: unknown): boolean {
  return isSandgymError(error, 'resource_exhausted') && !error.retryable;
}

/** The layer and environment that {@link PlatformClient.packDiff} made. */
export interface PackDiffResult {
  layer: LayerManifest;
  /** Set when a name was given. */
  environment?: Environment;
  /** The `reportPaths` the sandbox had written, created or deleted (itself, or by replacing a folder above). */
  present: string[];
  /**
   * What was left out besides the excluded paths: FIFOs, sockets and device nodes, names and paths
   * too long for a layer, whatever stood in place of an excluded path's folder, and links into
   * hidden paths.
   */
  dropped: DroppedEntry[];
  /** What the exclusion patterns took out (start-up hooks, caches): see FilterReport. */
  excludedByPattern: string[];
  /** Whether the patterns took out more than `excludedByPattern` lists: see FilterReport. */
  excludedByPatternCut: boolean;
}

/** Options for {@link PlatformClient.layerGc}. */
export interface LayerGcOptions extends CallOptions {
  minAgeMs?: number;
  /**
   * The node's admin only (the embedded platform): collect every project's unused layers, not
   * only this project's. Still never one an environment references or a process pinned.
   */
  allProjects?: boolean;
}

/** What {@link PlatformClient.layerGc} removed. */
export interface LayerGcReport {
  unmounted: string[];
  removedCopies: string[];
  removedLayers: string[];
  freedBytes: number;
}
