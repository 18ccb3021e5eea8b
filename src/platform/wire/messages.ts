import { z } from 'zod';
import { BACKEND_NAMES, PACK_REPORT_MAX_ENTRIES } from '../../backends/index.ts';
import { ids, names, notAnId, pathInTree, textWithoutNul } from '../../common/index.ts';
import { environmentSchema, layerManifestSchema } from '../store/layer-store.ts';
import { networkRulesSchema, sandboxRequestSchema } from '../sandbox-request.ts';

/**
 * Message schemas of the wire protocol; docs/wire.md describes them for other languages.
 * Requests are strict (an unknown field is an error that names it); responses are parsed
 * leniently so an older client keeps working against a newer server.
 */

const count = z.number().int().nonnegative();
const bytes = z.instanceof(Uint8Array);
const absolutePath = notAnId(pathInTree('absolute'));
const sandboxIdField = ids.sandbox();

export const empty = z.strictObject({});
export const sandboxRef = z.strictObject({ sandboxId: sandboxIdField });

export const setNetworkRequest = z.strictObject({ sandboxId: sandboxIdField, rules: networkRulesSchema });

export const createRequest = z.strictObject({ request: sandboxRequestSchema });

/** A layer under a sandbox as clients see it: never its path on the node. */
const sandboxLayer = z.object({ digest: z.string(), sizeBytes: count.optional() });
const sandboxState = z.enum(['creating', 'running', 'paused', 'hibernated', 'stopping', 'stopped', 'failed']);
const failureReason = z.enum([
  'oom',
  'timeout',
  'preempted',
  'node_lost',
  'admission_rejected',
  'agent_crash',
  'platform_error',
]);

export const sandboxInfo = z.object({
  id: z.string(),
  backend: z.enum(BACKEND_NAMES),
  state: sandboxState,
  failure: failureReason.nullable(),
  layers: z.array(sandboxLayer),
  labels: z.record(z.string(), z.string()),
  resources: z.object({
    cpu: z.number(),
    memoryMib: count,
    pids: count,
    outputCapBytes: count,
    diskMib: count,
  }),
});
export type SandboxInfo = z.infer<typeof sandboxInfo>;

/** Who a call acts as in the sandbox ("name", "uid", "name:group", "uid:gid"); absent: root. */
const user = notAnId(textWithoutNul().max(64)).optional();

export const execRequest = z.strictObject({
  sandboxId: sandboxIdField,
  argv: z
    .array(notAnId(textWithoutNul().max(128 * 1024)))
    .min(1, 'argv needs a program')
    .max(4096),
  cwd: absolutePath.optional(),
  user,
  env: notAnId(z.record(textWithoutNul().min(1).max(256), textWithoutNul().max(128 * 1024))).optional(),
  stdin: bytes.optional(),
  outputCapBytes: z
    .number()
    .int()
    .positive()
    .max(64 * 1024 * 1024)
    .optional(),
  /** The command's own time limit: when it passes, its process group is killed and timedOut set. */
  timeoutMs: z.number().int().positive().optional(),
  /** A report channel for the command (fd 200, `$SANDGYM_REPORT_FD`); what it gets comes back as `report`. */
  reportChannel: z.boolean().optional(),
});

export type ExecRequest = z.output<typeof execRequest>;

export const execResult = z.object({
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  stdoutBytes: count,
  stderrBytes: count,
  stdoutTruncated: z.boolean(),
  stderrTruncated: z.boolean(),
  timedOut: z.boolean(),
  oomKilled: z.boolean(),
  durationMs: z.number().nonnegative(),
  report: z.string().optional(),
  reportBytes: count.optional(),
  reportTruncated: z.boolean().optional(),
});

/** Exec streams output chunks as they arrive, then exactly one result. */
export const execEvent = z.discriminatedUnion('type', [
  z.object({ type: z.literal('chunk'), stream: z.enum(['stdout', 'stderr', 'report']), data: bytes }),
  z.object({ type: z.literal('result'), result: execResult }),
]);
export type ExecEvent = z.infer<typeof execEvent>;

export const readFileRequest = z.strictObject({
  sandboxId: sandboxIdField,
  path: absolutePath,
  user,
  maxBytes: z
    .number()
    .int()
    .positive()
    .max(64 * 1024 * 1024)
    .optional(),
});
export const fileData = z.object({ data: bytes });

export const writeFileRequest = z.strictObject({
  sandboxId: sandboxIdField,
  path: absolutePath,
  user,
  data: bytes.refine((value) => value.byteLength <= 64 * 1024 * 1024, 'files are at most 64 MiB per call'),
  mode: z.number().int().min(0).max(0o7777).optional(),
});

export const listDirRequest = z.strictObject({ sandboxId: sandboxIdField, path: absolutePath, user });
export const dirEntries = z.object({
  entries: z.array(
    z.object({
      name: z.string(),
      type: z.enum(['file', 'dir', 'symlink', 'other']),
      size: count,
      mode: count,
    }),
  ),
  /** The folder holds more entries than these (see DirListing). */
  truncated: z.boolean().optional(),
});

export const hibernateReport = z.object({
  state: z.enum(['hibernated', 'paused']),
  freedBytes: count,
  residentBytes: count,
  reason: z.string().optional(),
  swappedBytes: count.default(0),
  imageBytes: count.optional(),
});

const checkpointId = ids.checkpoint();
export const checkpointRequest = z.strictObject({
  sandboxId: sandboxIdField,
  depth: z.literal('memory').optional(),
});
export const sandboxCheckpoint = z.object({
  id: z.string(),
  sandboxId: z.string(),
  depth: z.literal('memory'),
  sizeBytes: count,
  createdAt: z.string(),
});
export const restoreCheckpointRequest = z.strictObject({ sandboxId: sandboxIdField, checkpointId });
export const forkInMemoryRequest = z.strictObject({
  sandboxId: sandboxIdField,
  count: z.number().int().min(1).max(64),
  /** An earlier checkpoint of the sandbox to start from; a fresh one when left out. */
  checkpointId: checkpointId.optional(),
});
export const sandboxInfos = z.object({ sandboxes: z.array(sandboxInfo) });

const trainingPhase = z.enum(['rollout', 'weight_sync', 'train', 'preempted', 'resumed']);
export const startRunRequest = z.strictObject({
  /** A run of the caller's project: another project's of the same name is another run. */
  name: names.run(),
  leaseMs: z
    .number()
    .int()
    .min(100, 'leaseMs is at least 100')
    .max(24 * 3600_000),
  /** How long after the lease lapses the run is cleaned up. */
  ttlMs: z
    .number()
    .int()
    .min(0)
    .max(7 * 24 * 3600_000)
    .optional(),
});
export const runRef = z.strictObject({ name: ids.run() });
/** How long the trainer expects a phase to last, in ms: at `preempted`, a short one keeps processes. */
export const expectedPhaseMs = z
  .number()
  .int()
  .min(1, 'expectedMs is at least 1')
  .max(7 * 24 * 3600_000);
export const setPhaseRequest = z.strictObject({
  name: ids.run(),
  phase: trainingPhase,
  expectedMs: expectedPhaseMs.optional(),
});
export const runStatus = z.object({
  name: z.string(),
  phase: trainingPhase,
  /** True while the lease has lapsed (the run's sandboxes are paused). */
  lapsed: z.boolean(),
  sandboxes: count,
});
export const phaseReport = z.object({
  phase: trainingPhase,
  paused: z.array(z.string()),
  hibernated: z.array(z.string()),
  resumed: z.array(z.string()),
  /** Of `resumed`: sandboxes whose restore was still running when the phase call returned. */
  restoring: z.array(z.string()).default([]),
  /** Sandboxes left running because a request was in flight. */
  busy: z.array(z.string()),
  freedBytes: count,
  /** Of `paused` at `preempted`: sandboxes whose hibernation could not free their memory, and why. */
  keptMemory: z.array(z.object({ sandboxId: z.string(), reason: z.string() })).default([]),
});
export const endRunReport = z.object({ destroyed: z.array(z.string()) });

export const sandboxStats = z.object({
  state: sandboxState,
  memoryBytes: count,
  pids: count,
  cpuUsageMs: z.number().nonnegative(),
  oomKills: count,
  deniedEgress: count.default(0),
  kernelMemoryBytes: count.default(0),
  diskBytes: count.default(0),
  pidsLimitHits: count.default(0),
  network: z
    .object({
      denied: z.array(z.string().max(64)).max(64),
      unresolved: z.array(z.string().max(300)).max(64),
    })
    .optional(),
});

export const writtenPathsRequest = z.strictObject({
  sandboxId: sandboxIdField,
  prefixes: z.array(absolutePath).max(256),
  limit: z.number().int().positive().max(4096).optional(),
});
export const writtenPaths = z.object({ paths: z.array(z.string()) });

export const sandboxRecords = z.object({
  sandboxes: z.array(
    z.object({
      id: z.string(),
      backend: z.enum(BACKEND_NAMES),
      state: z.enum(['running', 'paused', 'hibernated', 'orphaned']),
      ownerPid: z.number().int(),
      createdAt: z.string(),
      labels: z.record(z.string(), z.string()),
      layers: z.array(z.string()),
    }),
  ),
});

const relativePaths = notAnId(z.array(pathInTree('relative')).max(256));
const regexes = notAnId(z.array(textWithoutNul().min(1).max(4096)).max(256));
export const packDiffRequest = z.strictObject({
  sandboxId: sandboxIdField,
  /** An environment of the caller's project, written under it. */
  name: names.environment().optional(),
  description: notAnId(z.string().max(4096)).optional(),
  excludePaths: relativePaths.optional(),
  excludeRegexes: regexes.optional(),
  reportPaths: relativePaths.optional(),
  hiddenPaths: relativePaths.optional(),
});
export const packDiffResult = z.object({
  layer: layerManifestSchema,
  environment: environmentSchema.optional(),
  present: z.array(z.string()),
  dropped: z
    .array(
      z.object({
        path: z.string(),
        reason: z.enum([
          'replaces_an_excluded_folder',
          'special_file',
          'name_too_long',
          'path_too_long',
          'name_not_utf8',
          'links_into_hidden',
        ]),
      }),
    )
    .max(PACK_REPORT_MAX_ENTRIES)
    .default([]),
  excludedByPattern: z.array(z.string()).max(PACK_REPORT_MAX_ENTRIES).default([]),
  excludedByPatternCut: z.boolean().default(false),
});
export const environmentRef = z.strictObject({ ref: ids.environment() });
export const environmentMessage = environmentSchema;
export const environments = z.object({ environments: z.array(environmentSchema) });

export const gcReport = z.object({
  sandboxes: z.array(z.string()),
  mounts: z.array(z.string()),
  cgroups: z.array(z.string()),
});
export const layerGcRequest = z.strictObject({ minAgeMs: count.optional() });
export const layerGcReport = z.object({
  unmounted: z.array(z.string()),
  removedCopies: z.array(z.string()),
  removedLayers: z.array(z.string()),
  freedBytes: count,
});

const trajectoryRecord = z.object({
  episodeId: z.string(),
  stepIndex: count,
  action: z.unknown(),
  result: z.unknown(),
  startedAt: z.string(),
  durationMs: z.number().nonnegative(),
});

/**
 * One step. The action is checked where it runs (the node's action schema); options are how it
 * runs, not what it is, so a retry with other options still matches its record.
 */
export const stepRequest = z.strictObject({
  sandboxId: sandboxIdField,
  episodeId: ids.episode('sandbox'),
  stepIndex: count,
  /** Parsed where it runs (the node's action schema), inside the sandbox: it names nothing outside. */
  action: notAnId(z.unknown()),
  options: z
    .strictObject({
      user,
      protectedPaths: z.array(absolutePath).max(256).optional(),
      commandTimeoutCapMs: z.number().int().positive().optional(),
    })
    .optional(),
});
export const stepReply = z.object({
  result: z.object({
    observation: z.record(z.string(), z.unknown()),
    reward: z.number(),
    terminated: z.boolean(),
    truncated: z.boolean(),
    outcome: z.record(z.string(), z.unknown()),
    info: z.record(z.string(), z.unknown()),
  }),
  replayed: z.boolean(),
  logCapped: z.boolean().default(false),
  startedAt: z.string(),
  durationMs: z.number().nonnegative(),
});
export const trajectory = z.object({ records: z.array(trajectoryRecord) });

/** What a node agent reports to the controllers' watchers. */
export const nodeStatus = z.object({
  nodeId: z.string(),
  backends: z.array(z.enum(BACKEND_NAMES)),
  healthy: z.boolean(),
  sandboxes: count,
  capacity: count,
  memoryCommittedMib: count,
  memoryCapacityMib: count,
  /** Live sandboxes per project, for quotas. */
  projects: z.record(z.string(), count),
  /** Draining: it takes no new sandboxes and waits for its own to end or hibernate. */
  draining: z.boolean().default(false),
});

/** Drain a node: optionally hibernate its idle sandboxes now rather than wait for them. */
export const drainRequest = z.object({ hibernateIdle: z.boolean().default(false) });

/** Progress of a drain, streamed until nothing on the node is left running. */
export const drainProgress = z.object({
  /** Sandboxes still running or paused: what the drain waits for. */
  remaining: count,
  hibernated: count,
  /** Ids of the sandboxes still running, at most 20. */
  waitingFor: z.array(z.string()),
});
export type DrainProgress = z.infer<typeof drainProgress>;
export type NodeStatus = z.infer<typeof nodeStatus>;
