import { mkdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { isAlive, startDetachedNode, type SandboxRecord } from '../backends/index.ts';
import { SANDGYM_ERROR_CODES, SandgymError, parseAt, writeFileAtomic } from '../common/index.ts';
import {
  DEFAULT_PROJECT,
  PROJECT_LABEL,
  Platform,
  defaultProject,
  type LocalPlatform,
  type PlatformClient,
  type Sandbox,
  type SandboxRequest,
} from '../platform/index.ts';

/**
 * On the embedded platform a sandbox belongs to the process that made it and ends with it. A
 * sandbox that `sandgym create` leaves behind is owned by a holder instead: a detached process
 * (src/cli/sandbox-holder.ts) that makes it through a node agent of its own, listening on
 * loopback behind a random token, and serves it to other processes (`exec`, `mcp --sandbox`,
 * `kill`) as a node serves a controller. The holder ends when its sandbox does: killed, past its
 * idle TTL or deadline, or failed. A holder that crashed leaves an orphan, which `sandgym gc`
 * reaps like any other.
 */

/** What a holder writes for other processes to find it: `<dataDir>/holders/<pid>.json`, root's alone. */
const holderRecordSchema = z.strictObject({
  owner: z.strictObject({ pid: z.number().int().positive(), startTime: z.number() }),
  sandbox: z.string(),
  port: z.number().int().min(1).max(65_535),
  token: z.string().min(32),
});

export type HolderRecord = z.infer<typeof holderRecordSchema>;

/** What a holder tells `sandgym create` on its stdout, once: the sandbox, or why there is none. */
const holderReplySchema = z.union([
  z.strictObject({
    sandbox: z.strictObject({
      id: z.string(),
      backend: z.string(),
      environment: z.string().optional(),
      ownerPid: z.number().int(),
    }),
  }),
  z.strictObject({ error: z.strictObject({ code: z.enum(SANDGYM_ERROR_CODES), message: z.string() }) }),
]);

export type HolderReply = z.infer<typeof holderReplySchema>;

/** The sandbox a holder made, as `sandgym create` prints it. */
export type HeldSandboxInfo = Extract<HolderReply, { sandbox: unknown }>['sandbox'];

function holdersDir(dataDir: string): string {
  return join(dataDir, 'holders');
}

/** The holder record of process `pid` (a number from a node record, never a caller's text). */
function holderPath(dataDir: string, pid: number): string {
  if (!Number.isSafeInteger(pid) || pid <= 0) throw new Error(`not a process id: ${pid}`);
  return join(holdersDir(dataDir), `${pid}.json`);
}

/** Records this process as the holder of `record.sandbox`; readable by root alone (it holds the token). */
export async function writeHolderRecord(dataDir: string, record: HolderRecord): Promise<void> {
  await mkdir(holdersDir(dataDir), { recursive: true, mode: 0o700 });
  await writeFileAtomic(holderPath(dataDir, record.owner.pid), JSON.stringify(record), { mode: 0o600 });
}

export async function removeHolderRecord(dataDir: string, pid: number): Promise<void> {
  await rm(holderPath(dataDir, pid), { force: true });
}

/** The live holder that is process `pid`, or undefined (no record, or a dead or reused pid's). */
async function liveHolder(dataDir: string, pid: number): Promise<HolderRecord | undefined> {
  const path = holderPath(dataDir, pid);
  const text = await readFile(path, 'utf8').catch(() => undefined);
  if (text === undefined) return undefined;
  let record: HolderRecord;
  try {
    record = parseAt(holderRecordSchema, JSON.parse(text), `holder record ${path}`);
  } catch {
    return undefined;
  }
  if (record.owner.pid !== pid || !(await isAlive(record.owner))) {
    // a holder killed hard left its record: nothing serves it any more
    await rm(path, { force: true });
    return undefined;
  }
  return record;
}

/** The most a holder may take to make its sandbox: a first VM builds its image. */
const HOLDER_START_TIMEOUT_MS = 15 * 60_000;

/**
 * Starts a holder for a sandbox of `request` and waits for its answer: the sandbox made (it then
 * outlives this process), or the error that kept it from being made, thrown as the holder saw it.
 */
export async function startHolder(request: SandboxRequest): Promise<HeldSandboxInfo> {
  const script = fileURLToPath(new URL('./sandbox-holder.js', import.meta.url));
  const line = await startDetachedNode(script, [JSON.stringify(request)], HOLDER_START_TIMEOUT_MS);
  const reply = parseAt(holderReplySchema, JSON.parse(line), 'the sandbox holder reply');
  if ('error' in reply) throw new SandgymError(reply.error.code, reply.error.message);
  return reply.sandbox;
}

/** A sandbox reached from this process, with the platform that reaches it; disposing leaves the sandbox. */
export interface ReachedSandbox extends AsyncDisposable {
  platform: PlatformClient;
  sandbox: Sandbox;
}

/**
 * Sandbox `id` of this host, through its holder (see above). The id is resolved as `ps` and
 * `kill` resolve it, from the node's records; only then is its owner's holder record read, by
 * the owner's pid. `not_found` when the node has no such sandbox (or the holder serves it to
 * another project); `failed_precondition` when a process that serves no one else owns it.
 */
export async function reachHeldSandbox(id: string): Promise<ReachedSandbox> {
  const holder = await (async () => {
    await using local = await Platform.local();
    const { record, holder } = await holderOf(local, id);
    if (holder) return holder;
    throw new SandgymError(
      'failed_precondition',
      record.state === 'orphaned'
        ? `Sandbox ${id}'s owner (process ${record.ownerPid}) is gone: "sandgym gc" reaps it`
        : `Sandbox ${id} belongs to process ${record.ownerPid}, which serves it to no other process: make one with "sandgym create" to reach it from here`,
    );
  })();
  const platform = await connectHolder(holder);
  try {
    const sandbox = await platform.attachSandbox(id);
    return { platform, sandbox, [Symbol.asyncDispose]: () => platform.close() };
  } catch (error) {
    await platform.close();
    throw error;
  }
}

/**
 * Destroys sandbox `id` of this host: through its holder when one owns it, so the holder ends
 * cleanly with it; else as `kill` always has, whichever process owns it.
 */
export async function killLocalSandbox(id: string): Promise<void> {
  await using local = await Platform.local();
  const { holder } = await holderOf(local, id);
  if (!holder) return await local.killSandbox(id);
  await using platform = await connectHolder(holder);
  await platform.killSandbox(id);
}

function connectHolder(holder: HolderRecord): Promise<PlatformClient> {
  return Platform.connect(`127.0.0.1:${holder.port}`, {
    token: holder.token,
    // the holder's node agent keeps its sandbox to the project that made it
    metadata: { 'sandgym-project': defaultProject() },
  });
}

/** Sandbox `id`'s node record (`not_found` without one) and its holder, if a live holder owns it. */
/**
 * The record of sandbox `id` of this host, if it is this project's ($SANDGYM_PROJECT): every
 * command that takes a sandbox id here (kill, exec, mcp --sandbox, layer build --from-sandbox)
 * resolves it through this, so another project's sandbox is as missing as one never made.
 */
export async function projectSandboxRecord(local: LocalPlatform, id: string): Promise<SandboxRecord> {
  const record = (await local.listSandboxes()).find(
    (candidate) =>
      candidate.id === id && (candidate.labels[PROJECT_LABEL] ?? DEFAULT_PROJECT) === defaultProject(),
  );
  if (!record) throw new SandgymError('not_found', `No sandbox "${id}" on this node: see "sandgym ps"`);
  return record;
}

async function holderOf(
  local: LocalPlatform,
  id: string,
): Promise<{ record: SandboxRecord; holder?: HolderRecord }> {
  const record = await projectSandboxRecord(local, id);
  const holder = await liveHolder(local.dataDir, record.ownerPid);
  return holder?.sandbox === id ? { record, holder } : { record };
}
