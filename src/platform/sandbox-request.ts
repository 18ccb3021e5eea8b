import { z } from 'zod';
import { BACKEND_NAMES } from '../backends/index.ts';
import { ENV_VAR_NAME, ids, notAnId, textWithoutNul } from '../common/index.ts';
import { DEFAULT_ENVIRONMENT } from './store/base-environments.ts';

/**
 * What a sandbox may ask for, at least and at most: below, the agent, the runtime's setup and a
 * shell do not fit; above, no machine has it, and the number is a typo or an attack. A request
 * out of range is refused at the door naming the field, never later as an infrastructure fault.
 */
export const SANDBOX_LIMITS = {
  maxCpu: 1024,
  minMemoryMib: 16,
  maxMemoryMib: 4 * 1024 * 1024,
  minDiskMib: 16,
  maxDiskMib: 1024 * 1024 * 1024,
  minPids: 8,
  /** The kernel's own ceiling (PID_MAX_LIMIT). */
  maxPids: 4 * 1024 * 1024,
} as const;
const { maxCpu, minMemoryMib, maxMemoryMib, minDiskMib, maxDiskMib, minPids, maxPids } = SANDBOX_LIMITS;

/** A sandbox's network rules, by name. */
export const networkRulesSchema = notAnId(z.array(z.string().min(1).max(256)).max(64));

/** What a sandbox may write unless it asks for more or less (or the node's volume holds less). */
export const DEFAULT_DISK_MIB = 10 * 1024;

/**
 * What a caller asks for. Validated at createSandbox(); every field has a default, and an unknown
 * field (a typo) is an error rather than silently ignored.
 */
export const sandboxRequestSchema = z.strictObject({
  backend: z.enum(BACKEND_NAMES).default('container'),
  environment: ids.environment().default(DEFAULT_ENVIRONMENT),
  resources: z
    .strictObject({
      cpu: z.number().positive().max(maxCpu, `cpu must be at most ${maxCpu}`).default(1),
      memoryMib: z
        .number()
        .int()
        .min(minMemoryMib, `memoryMib must be at least ${minMemoryMib}: the agent and runtime need it`)
        .max(maxMemoryMib, `memoryMib must be at most ${maxMemoryMib} (4 TiB)`)
        .default(512),
      pids: z
        .number()
        .int()
        .min(minPids, `pids must be at least ${minPids}`)
        .max(maxPids, `pids must be at most ${maxPids}`)
        .default(512),
      outputCapBytes: z
        .number()
        .int()
        .positive()
        .max(64 * 1024 * 1024)
        .default(1024 * 1024),
      /** Default: {@link DEFAULT_DISK_MIB}, or what the node's volume holds when that is less. */
      diskMib: z
        .number()
        .int()
        .min(minDiskMib, `diskMib must be at least ${minDiskMib}: package managers and logs need room`)
        .max(maxDiskMib, `diskMib must be at most ${maxDiskMib} (1 PiB)`)
        .optional(),
    })
    .prefault({}),
  qos: z.enum(['latency', 'best_effort']).default('latency'),
  env: notAnId(
    z.record(z.string().regex(ENV_VAR_NAME, 'env names are letters, digits and _'), textWithoutNul()),
  ).default({}),
  workdir: notAnId(textWithoutNul().startsWith('/', 'workdir must be absolute')).optional(),
  labels: notAnId(
    z.record(
      z
        .string()
        .refine((name) => !name.startsWith('sandgym.'), 'labels starting with "sandgym." are reserved'),
      z.string(),
    ),
  ).default({}),
  /**
   * Layers (sha256 digests) stacked over the environment's own: an agent's diff, a checkpoint.
   * Each must be one the project made or one of an environment it can boot.
   */
  extraLayers: z.array(ids.layer()).max(64).optional(),
  /** When the platform reclaims it: after `idleTtlMs` without a request, `deadlineMs` after creation. */
  lifetime: z
    .strictObject({
      idleTtlMs: z.number().int().positive().optional(),
      deadlineMs: z.number().int().positive().optional(),
    })
    .optional(),
  /**
   * Named network rules (the node's rule book: `mirror:debian`, `host:IP[:PORT]`, `cidr:...`);
   * empty, the default, is loopback only. `sandbox.setNetwork` replaces them later.
   */
  network: networkRulesSchema.default([]),
  /** The run (see startRun) that owns the sandbox: its lease and phases govern it. */
  run: ids.run().optional(),
});

/** The caller's form of a sandbox request. */
export type SandboxRequest = z.input<typeof sandboxRequestSchema>;
/** A request with every default filled in. */
export type ResolvedSandboxRequest = z.output<typeof sandboxRequestSchema>;
