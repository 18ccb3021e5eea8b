import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { parseAt, writeFileAtomic, writeSmallFileAtomicNow } from '../../common/index.ts';
import type { BackendName, SandboxRecord } from '../contract.ts';
import { isAlive } from './processes.ts';

/**
 * What every backend writes in a sandbox's folder on the node, so that any process sharing the
 * data dir can list, kill, adopt or reap it: whose it is, when it began, what it stacks.
 */
export const nodeRecordSchema = z.object({
  id: z.string(),
  /** The process that owns it, by pid and start time (a reused pid is not its owner). */
  owner: z.object({ pid: z.number().int(), startTime: z.number() }),
  createdAt: z.string(),
  /** Digests of its layers, base first. */
  layers: z.array(z.string()),
  labels: z.record(z.string(), z.string()),
});

export type NodeRecord = z.infer<typeof nodeRecordSchema>;

const RECORD_FILE = 'state.json';

/** Writes a sandbox's record into its folder, crash-safe; `sync` also survives a power loss. */
export async function writeNodeRecord(dir: string, record: NodeRecord, sync: boolean): Promise<void> {
  const path = join(dir, RECORD_FILE);
  const text = JSON.stringify(record, null, 2);
  if (sync) await writeFileAtomic(path, text, { sync });
  else writeSmallFileAtomicNow(path, text);
}

/** A sandbox's record, or undefined for a folder whose creation never got that far (or garbage). */
export async function readNodeRecord<S extends z.ZodType<NodeRecord>>(
  dir: string,
  schema: S,
): Promise<z.infer<S> | undefined> {
  let text: string;
  try {
    text = await readFile(join(dir, RECORD_FILE), 'utf8');
  } catch {
    return undefined;
  }
  try {
    return parseAt(schema, JSON.parse(text), `sandbox record ${join(dir, RECORD_FILE)}`);
  } catch {
    return undefined;
  }
}

/** How `sandgym ps` shows a recorded sandbox: orphaned once its owner is gone, else as `stateOf` finds it. */
export async function listedRecord(
  record: NodeRecord,
  backend: BackendName,
  stateOf: () => Promise<'running' | 'paused' | 'hibernated'>,
): Promise<SandboxRecord> {
  const alive = await isAlive(record.owner);
  return {
    id: record.id,
    backend,
    state: alive ? await stateOf() : 'orphaned',
    ownerPid: record.owner.pid,
    createdAt: record.createdAt,
    labels: record.labels,
    layers: record.layers,
  };
}
