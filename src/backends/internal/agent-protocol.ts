import { z } from 'zod';

/** Schemas of what the in-sandbox agent sends. Its messages cross a trust boundary: validate all. */
const bytes = z.instanceof(Uint8Array);
const count = z.number().int().nonnegative();

export const agentReadySchema = z.object({
  t: z.literal('ready'),
  version: count,
  pid: count,
  /** The CPU class the agent put the sandbox in: `idle` is SCHED_IDLE (best-effort). */
  sched: z.enum(['normal', 'idle']).default('normal'),
  /** A core-scheduling cookie of its own (latency class), where the kernel has core scheduling. */
  coreCookie: z.enum(['off', 'own', 'unsupported']).default('off'),
  /**
   * The agent's own process state that other processes of its uid could change (limits, nice,
   * I/O priority, affinity, OOM score): what a warm sandbox's agent must still show when reused.
   */
  state: z.string().max(8192).default(''),
});

const agentOutputSchema = z.object({
  t: z.literal('out'),
  id: count,
  /** 1 stdout, 2 stderr, 3 the command's report channel (see ExecOptions.reportChannel). */
  fd: z.union([z.literal(1), z.literal(2), z.literal(3)]),
  data: bytes,
});

export const agentExitSchema = z.object({
  t: z.literal('exit'),
  id: count,
  exitCode: z.number().int().nullable(),
  signal: z.number().int().nullable(),
  timedOut: z.boolean(),
  cancelled: z.boolean(),
  durationUs: count,
  stdoutBytes: count,
  stderrBytes: count,
  stdoutTruncated: z.boolean(),
  stderrTruncated: z.boolean(),
  /** Sent for a command that had a report channel: what it wrote there, and whether past the cap. */
  reportBytes: count.optional(),
  reportTruncated: z.boolean().optional(),
  /**
   * The agent's process state when the command ended, sent only when no other process was left in
   * the sandbox then (so nothing could change it afterwards): see AgentReady.state.
   */
  agentStateAlone: z.string().max(8192).optional(),
});

const agentDirEntrySchema = z.object({
  name: z.string(),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  size: count,
  mode: count,
});

export const agentOkSchema = z.object({
  t: z.literal('ok'),
  id: count,
  data: bytes.optional(),
  entries: z.array(agentDirEntrySchema).optional(),
  /** `list`: the folder holds more entries than the agent lists (see file_list). */
  truncated: z.boolean().optional(),
  /** `procs`: processes of the sandbox besides the agent (kernel threads not counted). */
  count: z.number().int().nonnegative().optional(),
  /** `procstate`: the agent's own process state now, as in its ready message. */
  state: z.string().max(8192).optional(),
  /** `sync`, `ping`: the protocol the agent speaks (since version 2). */
  version: count.optional(),
});

const agentErrorSchema = z.object({
  t: z.literal('error'),
  id: count,
  code: z.string(),
  message: z.string(),
});

export const agentMessageSchema = z.discriminatedUnion('t', [
  agentReadySchema,
  agentOutputSchema,
  agentExitSchema,
  agentOkSchema,
  agentErrorSchema,
]);

export type AgentReady = z.infer<typeof agentReadySchema>;
export type AgentExit = z.infer<typeof agentExitSchema>;
export type AgentOk = z.infer<typeof agentOkSchema>;
export type AgentMessage = z.infer<typeof agentMessageSchema>;

/** The largest frame either side sends; matches CHANNEL_MAX_FRAME in agent/channel.h. */
export const MAX_FRAME_BYTES = 80 * 1024 * 1024;
