import { z } from 'zod';
import { nodeRecordSchema, readNodeRecord, writeNodeRecord } from '../host/node-records.ts';

/** What a container sandbox's folder records about it (see {@link nodeRecordSchema}). */
export const containerStateSchema = nodeRecordSchema.extend({
  /** The sandbox it serves; for a pooled shell, its slot. */
  id: z.string(),
  /** The name of its folder, cgroups and runtime state (the id, for a sandbox created cold). */
  slot: z.string().optional(),
  /** A warm shell waiting in the pool, with no tenant. */
  pooled: z.boolean().optional(),
  /** Counters its container ran up before this tenant, which its stats leave out. */
  baseline: z
    .object({
      cpuUsageMs: z.number(),
      oomKills: z.number(),
      pidsLimitHits: z.number().default(0),
      memoryLimitHits: z.number().default(0),
    })
    .optional(),
  backend: z.literal('container'),
  /** Set for sandboxes that outlive their owner, to be adopted by its successor. */
  durable: z.boolean().optional(),
  /** Set while it hibernates by memory image: the image's folder in the sandbox's folder. */
  memoryImage: z
    .string()
    .regex(/^memory-[0-9a-f]+$/)
    .optional(),
  /** The spec it was created from, so a successor can rebuild its handle. */
  spec: z
    .object({
      id: z.string(),
      layers: z.array(z.object({ digest: z.string(), path: z.string(), sizeBytes: z.number().optional() })),
      env: z.record(z.string(), z.string()),
      workdir: z.string(),
      resources: z.object({
        cpu: z.number(),
        memoryMib: z.number(),
        pids: z.number(),
        outputCapBytes: z.number(),
        // records from before disk caps: the request default
        diskMib: z.number().default(10 * 1024),
      }),
      qos: z.enum(['latency', 'best_effort']),
      labels: z.record(z.string(), z.string()),
      lifetime: z.object({ idleTtlMs: z.number().optional(), deadlineMs: z.number().optional() }).optional(),
      network: z.array(z.string()).readonly().default([]),
    })
    .optional(),
});

export type ContainerState = z.infer<typeof containerStateSchema>;

/** `sync` is for durable sandboxes, which must find their state again after a power loss. */
export function writeContainerState(dir: string, state: ContainerState, sync = true): Promise<void> {
  return writeNodeRecord(dir, state, sync);
}

/** The recorded state, or undefined for a folder whose creation never got that far. */
export function readContainerState(dir: string): Promise<ContainerState | undefined> {
  return readNodeRecord(dir, containerStateSchema);
}
