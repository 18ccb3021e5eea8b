import type { FailureReason } from '../common/index.ts';
import type { DiffFilter, FilterReport } from './host/diff-filter.ts';

/** The four kinds of sandbox behind one API: the one list every schema and switch takes them from. */
export const BACKEND_NAMES = ['container', 'fncall', 'microvm', 'vm'] as const;

/** One of {@link BACKEND_NAMES}. */
export type BackendName = (typeof BACKEND_NAMES)[number];

/** Latency-sensitive sandboxes get the CPU first; best-effort ones yield to them. */
export type QosClass = 'latency' | 'best_effort';

/** Lifecycle states of a sandbox, whichever backend runs it. */
export type SandboxState =
  'creating' | 'running' | 'paused' | 'hibernated' | 'stopping' | 'stopped' | 'failed';

/** Cancellation and deadline for any async call. */
export interface CallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

/** How deep a hibernation goes. */
export interface HibernateOptions extends CallOptions {
  /**
   * Keep the processes: freeze them and push their memory to swap instead of dumping them to a
   * memory image. Back in milliseconds rather than a restore's hundreds, for a short
   * preemption; it frees less (kernel memory stays) and nothing without swap. Backends whose
   * hibernation keeps processes anyway (VM snapshots) ignore it.
   */
  keepProcesses?: boolean;
}

/** An EROFS layer image in the store, as a backend needs it. */
export interface LayerImage {
  digest: string;
  path: string;
  /** The size its manifest records; checked before mounting. */
  sizeBytes?: number;
}

/**
 * How a node gets layers:
 * - `ondemand`: mount straight from the store, so only the blocks that are read travel;
 * - `eager`: copy each whole layer to node-local disk first (the "pull" baseline);
 * - `tar`: unpack a tar.gz of each layer for every sandbox (the classic baseline).
 */
export type LoadMode = 'ondemand' | 'eager' | 'tar';

/**
 * What is checked before a layer is mounted: its whole sha256 (`digest`, once per node and
 * file), or only its recorded size (`size`, for stores whose contents are verified when
 * written, so on-demand loading stays on demand). `eager` always checks the digest as it copies.
 */
export type LayerVerification = 'digest' | 'size';

/** Resource caps of one sandbox, already validated. */
export interface SandboxResources {
  /** CPU cores (fractions allowed); enforced as a CFS quota. */
  cpu: number;
  memoryMib: number;
  pids: number;
  /** Bytes captured per command and stream; the rest is counted and reported as truncated. */
  outputCapBytes: number;
  /** What it may write (files, directories and their metadata); writes beyond it fail with EDQUOT. */
  diskMib: number;
}

/** A fully resolved sandbox request, as a backend receives it. */
export interface SandboxSpec {
  id: string;
  /** Base first, top last. */
  layers: LayerImage[];
  env: Record<string, string>;
  workdir: string;
  resources: SandboxResources;
  qos: QosClass;
  labels: Record<string, string>;
  /** When the platform reclaims it: after this long without a request, or this long after creation. */
  lifetime?: SandboxLifetime;
  /** Named network rules it starts with (see {@link BackendSandbox.setNetwork}); empty: loopback only. */
  network: readonly string[];
  /**
   * Whether its memory must be checkpointable where the host allows (a training run's sandboxes,
   * which hibernate when preempted): a container then never starts on a pooled shell, whose
   * swapped root CRIU cannot restore.
   */
  memorySnapshots?: boolean;
}

/** How long a sandbox may live when nobody uses it, and at most. */
export interface SandboxLifetime {
  idleTtlMs?: number;
  deadlineMs?: number;
}

/** What a backend can and cannot do. An operation it cannot do fails with `unsupported`. */
export interface BackendCapabilities {
  pause: boolean;
  hibernate: boolean;
  /** How deep a checkpoint goes: nothing, the filesystem, or memory and processes too. */
  checkpoint: 'none' | 'disk' | 'memory';
  fork: boolean;
  shellSessions: boolean;
  /** Whether a sandbox has its own network namespace (loopback only unless a policy opens it). */
  ownNetwork: boolean;
  /** Whether its network rules can name anything beyond loopback ({@link BackendSandbox.setNetwork}). */
  networkPolicy: boolean;
  /**
   * Whether what one command writes is there for the next. FnCall sandboxes are stateless: each
   * call starts from the image plus the files written with writeFile, and leaves nothing behind.
   */
  statefulExec: boolean;
}

/** Who a call acts as in the sandbox. */
export interface UserOptions {
  /**
   * "name", "uid", "name:group" or "uid:gid", as Docker's USER, looked up in the sandbox's own
   * /etc/passwd and /etc/group; the call then has exactly that user's rights and groups.
   * Default root: the platform's own calls.
   */
  user?: string;
}

/** Options of one command. */
export interface ExecOptions extends CallOptions, UserOptions {
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string | Uint8Array;
  /** Bytes captured per stream; defaults to the sandbox's cap. */
  outputCapBytes?: number;
  /**
   * Give the command a report channel: the write end of a pipe on fd {@link REPORT_FD} (named in
   * `$SANDGYM_REPORT_FD`), inherited by everything it starts. What is written there comes back
   * as the result's `report`: read as it is written, so no later process can take it back. A
   * grader's test harness reports through it (see docs/security.md).
   */
  reportChannel?: boolean;
}

/** The fd number of a command's report channel (see {@link ExecOptions.reportChannel}). */
export const REPORT_FD = 200;

/** How a command ended. `stdout`/`stderr` hold at most the output cap, decoded as UTF-8. */
export interface ExecResult {
  exitCode: number | null;
  /** The signal that ended it, e.g. "SIGKILL", or null. */
  signal: string | null;
  stdout: string;
  stderr: string;
  stdoutBytes: number;
  stderrBytes: number;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  timedOut: boolean;
  /** Killed by the kernel's OOM killer at the sandbox's memory limit. */
  oomKilled: boolean;
  durationMs: number;
  /** With {@link ExecOptions.reportChannel}: what was written to the report channel (at most the output cap). */
  report?: string | undefined;
  reportBytes?: number | undefined;
  reportTruncated?: boolean | undefined;
}

/** A piece of a running command's output. */
export interface ExecChunk {
  stream: 'stdout' | 'stderr' | 'report';
  data: Buffer;
}

/** A running command: its output as it arrives, and its result when it ends. */
export interface ExecStream {
  output: AsyncIterable<ExecChunk>;
  result: Promise<ExecResult>;
}

/** One entry of a directory listing. */
export interface DirEntry {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
}

/**
 * A folder's entries. `truncated`: the folder holds more than one reply may carry (the agent lists
 * at most 50,000 entries or 16 MiB of them), and these are only some of them.
 */
export type DirListing = DirEntry[] & { truncated?: boolean };

/** What {@link BackendSandbox.hibernate} did, as measured. */
export interface HibernateReport {
  /**
   * What the sandbox is now: `hibernated` when its processes' memory left the node's memory (to a
   * memory image, or to swap); `paused` when it could only be frozen, its memory still resident
   * (`reason` says why: say CRIU could not dump a ptrace-stopped process, and there is no swap).
   */
  state: 'hibernated' | 'paused';
  /** What its memory use dropped by. */
  freedBytes: number;
  /** What it still holds in the node's memory (kernel memory stays whichever way). */
  residentBytes: number;
  /** Why its memory stayed resident, when `state` is `paused`. */
  reason?: string;
  /** Of its memory, what went to swap (the node's swap must stay for it to come back). */
  swappedBytes?: number;
  /** Set when it hibernated by memory snapshot: the bytes of the image on the node's disk. */
  imageBytes?: number;
}

/**
 * A checkpoint of a sandbox's processes, memory and files, kept on its node until the sandbox
 * ends: what {@link BackendSandbox.restore} goes back to and a memory-depth fork starts from.
 */
export interface SandboxCheckpoint {
  id: string;
  sandboxId: string;
  depth: 'memory';
  /** Bytes it takes on the node's disk. */
  sizeBytes: number;
  createdAt: string;
}

/**
 * The checkpoints a sandbox keeps; a newer one past this deletes its oldest. Each holds a copy of
 * its memory and writes, outside its disk cap, so a client cannot fill its node with them.
 */
export const MAX_CHECKPOINTS_PER_SANDBOX = 8;

/** Options for {@link BackendSandbox.checkpoint}. */
export interface CheckpointOptions extends CallOptions {
  /**
   * How deep: `memory` (processes, memory and files). Files alone are an environment, made by
   * `platform.packDiff(sandbox, { name })`. @default 'memory'
   */
  depth?: 'memory';
}

/** Measured use of one sandbox. */
export interface SandboxStats {
  state: SandboxState;
  memoryBytes: number;
  pids: number;
  cpuUsageMs: number;
  oomKills: number;
  /** Attempts to reach an address the sandbox's network has no route to (its policy denies it). */
  deniedEgress: number;
  /** Of `memoryBytes`, what the kernel holds for it (page tables, stacks, slab): what swap cannot take. */
  kernelMemoryBytes: number;
  /** What it has written, as its disk cap counts it (0 where the backend does not measure it). */
  diskBytes: number;
  /** Forks refused at its pids limit. */
  pidsLimitHits: number;
  /**
   * What its network refused since its rules were last set (its current stage), where the
   * backend records it: absent for a sandbox with loopback only, whose attempts are only counted.
   */
  network?: NetworkRecord;
}

/** What a sandbox's network refused it during one stage, bounded. */
export interface NetworkRecord {
  /** Destinations its TCP and UDP flows were refused for, `IP:PORT/PROTO`: the first 16 distinct. */
  denied: string[];
  /** Names its resolver answered no address for (NXDOMAIN, refused, or the query denied). */
  unresolved: string[];
}

/** The part of {@link SandboxStats} that each step's audit compares. */
export type StepCounters = Pick<
  SandboxStats,
  'deniedEgress' | 'oomKills' | 'pidsLimitHits' | 'diskBytes' | 'pids'
>;

/** Options for {@link BackendSandbox.writeFile}. */
export interface WriteFileOptions extends CallOptions, UserOptions {
  mode?: number;
}

/** Options for {@link BackendSandbox.listDir}. */
export interface ListDirOptions extends CallOptions, UserOptions {}

/** Options for {@link BackendSandbox.writtenPaths}. */
export interface WrittenPathsOptions extends CallOptions {
  /** At most this many paths (default 256). */
  limit?: number;
}

/** Options for {@link BackendSandbox.readFile}. */
export interface ReadFileOptions extends CallOptions, UserOptions {
  maxBytes?: number;
}

/** One live sandbox of a backend. */
export interface BackendSandbox extends AsyncDisposable {
  readonly id: string;
  readonly backend: BackendName;
  readonly state: SandboxState;
  /** Set once the sandbox failed. */
  readonly failure: FailureReason | undefined;
  /** The read-only layers under the sandbox, base first. */
  readonly layers: readonly LayerImage[];
  /** The labels it was created with (the platform adds `environment`). */
  readonly labels: Readonly<Record<string, string>>;
  /** The caps it was created with. */
  readonly resources: Readonly<SandboxResources>;
  /** Requests of this handle in flight right now (a phase policy leaves busy sandboxes be). */
  readonly activeCalls: number;
  /** When a request last started or ended (ms since the epoch): what an idle TTL counts from. */
  readonly lastActiveAt: number;
  /** When its lifetime (idle TTL, hard deadline) says it must go (ms since the epoch), or undefined. */
  expiresAt(): number | undefined;
  /** Ends it for a platform reason (its lifetime ran out), which its handle then reports. */
  reclaim(reason: FailureReason): Promise<void>;
  exec(argv: string[], options?: ExecOptions): Promise<ExecResult>;
  execStream(argv: string[], options?: ExecOptions): ExecStream;
  readFile(path: string, options?: ReadFileOptions): Promise<Buffer>;
  writeFile(path: string, data: string | Uint8Array, options?: WriteFileOptions): Promise<void>;
  listDir(path: string, options?: ListDirOptions): Promise<DirListing>;
  pause(options?: CallOptions): Promise<void>;
  /**
   * Frees the sandbox's memory while keeping it: frozen, then its memory pushed out as far as the
   * backend can. Any later request resumes it. Backends without the capability fail `unsupported`.
   */
  hibernate(options?: HibernateOptions): Promise<HibernateReport>;
  /** Thaws a paused or hibernated sandbox. */
  resume(options?: CallOptions): Promise<void>;
  /**
   * Saves its processes, memory and files; it carries on. Backends whose `checkpoint`
   * capability is not `memory` (or a sandbox whose state a restore could not rebuild) fail
   * `unsupported`, naming what to use instead.
   */
  checkpoint(options?: CheckpointOptions): Promise<SandboxCheckpoint>;
  /** Goes back to one of its own checkpoints, in place: processes, memory and files as they were then. */
  restore(checkpoint: SandboxCheckpoint | string, options?: CallOptions): Promise<void>;
  stats(options?: CallOptions): Promise<SandboxStats>;
  /**
   * What a step's signals count from, and nothing more, as cheaply as the backend can (no thread
   * pool, no call into the sandbox). Backends without a cheaper path leave it out; the step's
   * audit then reads {@link stats}.
   */
  stepCounters?(): Promise<StepCounters>;
  /**
   * Replaces what the sandbox may reach with the addresses `rules` name (the node's rule book:
   * `mirror:debian`, `host:IP[:PORT]`, `cidr:A.B.C.D/N[:PORT]`), without restarting it; empty is
   * loopback only. What a task's stages switch between. Connections of the old rules that the new
   * ones deny stop at their next packet.
   */
  setNetwork(rules: readonly string[], options?: CallOptions): Promise<void>;
  /**
   * What its writable layer holds under `prefixes` (absolute paths): files and folders it wrote,
   * and those it deleted, at most `limit` of them. The audit's view of protected paths; backends
   * with no writable layer of their own return none.
   */
  writtenPaths(prefixes: readonly string[], options?: WrittenPathsOptions): Promise<string[]>;
  /**
   * Hands `consume` a folder holding everything the sandbox wrote (its overlay upper dir, with
   * whiteouts for deletions), frozen for the duration so the view is consistent. With a `filter`
   * it is instead a private copy of it, taken frozen and pruned by the filter (see
   * {@link DiffFilter}), which `consume` may change; the report says what the pruning found.
   * Backends whose `checkpoint` capability is not `disk` or deeper fail with `unsupported`.
   */
  withWritableLayer<T>(
    consume: (dir: string, report: FilterReport) => Promise<T>,
    options?: WritableLayerOptions,
  ): Promise<T>;
  /** Destroys the sandbox and everything it holds. Idempotent. */
  close(): Promise<void>;
}

/** Options for {@link BackendSandbox.withWritableLayer}. */
export interface WritableLayerOptions extends CallOptions {
  /** Hand over a private copy pruned by this filter instead of the live folder. */
  filter?: DiffFilter;
}

/** What a garbage collection removed. */
export interface GcReport {
  sandboxes: string[];
  mounts: string[];
  cgroups: string[];
}

/** A sandbox found on this node, owned by this process or another. */
export interface SandboxRecord {
  id: string;
  backend: BackendName;
  /**
   * `paused`: frozen, its memory still in the node's; `hibernated`: its memory written out (to a
   * memory image or to swap), as a hibernation report and a phase report say; `orphaned`: its
   * owner is gone.
   */
  state: 'running' | 'paused' | 'hibernated' | 'orphaned';
  ownerPid: number;
  createdAt: string;
  labels: Record<string, string>;
  /** Digests of the layers it stacks, base first. */
  layers: string[];
}

/** One kind of sandbox. Every backend passes the same conformance suite. */
export interface Backend extends AsyncDisposable {
  readonly name: BackendName;
  readonly capabilities: BackendCapabilities;
  create(spec: SandboxSpec, options?: CallOptions): Promise<BackendSandbox>;
  /** Sandboxes of this backend on this node, from every process that shares the data dir. */
  list(): Promise<SandboxRecord[]>;
  /** The handles of this process's live sandboxes. */
  live(): BackendSandbox[];
  /** Whether this node has a sandbox of that id, whichever process owns it. */
  holds(id: string): Promise<boolean>;
  /**
   * Takes over the durable sandboxes a dead predecessor on this data dir left running. Backends
   * whose sandboxes cannot outlive their owner return none; gc reaps what such an owner left.
   */
  adopt(): Promise<BackendSandbox[]>;
  /** Ends this process's sandboxes whose lifetime ran out (their handles say `timeout`); their ids. */
  reclaimExpired(now?: number): Promise<string[]>;
  /** Destroys a sandbox by id, whichever process owns it. */
  kill(id: string): Promise<void>;
  /** The handle of a live sandbox this process created; `not_found` for any other. */
  attach(id: string): BackendSandbox;
  /**
   * {@link BackendSandbox.withWritableLayer} for a sandbox by id, whichever process owns it;
   * also hands over the sandbox's layers and labels.
   */
  withWritableLayerOf<T>(
    id: string,
    consume: (
      dir: string,
      sandbox: Pick<BackendSandbox, 'layers' | 'labels'>,
      report: FilterReport,
    ) => Promise<T>,
    options?: WritableLayerOptions,
  ): Promise<T>;
  /**
   * New sandboxes, one per id, from checkpoint `checkpointId` of this process's sandbox
   * `sourceId` (one on its own shelf: any other sandbox's is `not_found`), all or none: each has
   * the source's spec (layers, resources, QoS, labels, lifetime) and carries on from the
   * checkpoint on its own. Backends that cannot fork at memory depth leave it out.
   */
  forkFrom?(
    sourceId: string,
    checkpointId: string,
    ids: readonly string[],
    options?: CallOptions,
  ): Promise<BackendSandbox[]>;
  /** Removes what dead owners left behind: sandboxes, mounts, cgroups. */
  gc(): Promise<GcReport>;
  /** Unmounts layers no sandbox uses and drops node-local layer copies nothing mounts. */
  gcLayers(): Promise<{ unmounted: string[]; removedCopies: string[] }>;
  /** Destroys this process's sandboxes. Idempotent. */
  close(): Promise<void>;
}
