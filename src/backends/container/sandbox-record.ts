import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { parseAt, writeFileAtomic } from '../../common/index.ts';

/** What a container sandbox's folder records about it, so any process can list, kill or reap it. */
export const containerStateSchema = z.object({
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
  owner: z.object({ pid: z.number().int(), startTime: z.number() }),
  createdAt: z.string(),
  layers: z.array(z.string()),
  labels: z.record(z.string(), z.string()),
  /** Set for sandboxes that outlive their owner, to be adopted by its successor. */
  durable: z.boolean().optional(),
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

export const STATE_FILE = 'state.json';

/** `sync` is for durable sandboxes, which must find their state again after a power loss. */
export function writeContainerState(dir: string, state: ContainerState, sync = true): Promise<void> {
  return writeFileAtomic(join(dir, STATE_FILE), JSON.stringify(state, null, 2), { sync });
}

/** The recorded state, or undefined for a folder whose creation never got that far. */
export async function readContainerState(dir: string): Promise<ContainerState | undefined> {
  let text: string;
  try {
    text = await readFile(join(dir, STATE_FILE), 'utf8');
  } catch {
    return undefined;
  }
  try {
    return parseAt(containerStateSchema, JSON.parse(text), `sandbox state ${join(dir, STATE_FILE)}`);
  } catch {
    return undefined;
  }
}
