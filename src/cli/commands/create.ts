import { writeFileAtomic } from '../../common/index.ts';
import type { SandboxRequest } from '../../platform/index.ts';
import { durationMs, parseCommandArgs, positiveInt, text } from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';
import { startHolder } from '../held-sandboxes.ts';
import { openCluster } from './cluster.ts';

/** How long a created sandbox may sit unused before it is reclaimed, unless --idle-ttl says otherwise. */
const DEFAULT_IDLE_TTL = '1h';

/**
 * `sandgym create [--env E] [--memory-mib N] [--idle-ttl D] [--deadline D] [--json [OUT]]`: a
 * sandbox that outlives this command, like `docker run -d`; its id on stdout. On this host a
 * detached holder process owns it (see held-sandboxes.ts); on a cluster its node does. Either way
 * it ends when killed, or once unused for its idle TTL, or at its deadline.
 */
export async function createCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('create', args, {
    env: { type: 'string' },
    'memory-mib': { type: 'string' },
    'idle-ttl': { type: 'string' },
    deadline: { type: 'string' },
    json: { type: 'boolean' },
  });
  const [out, ...extra] = parsed.positionals;
  if (extra.length || (out !== undefined && !parsed.values['json'])) {
    throw new UsageError(
      `sandgym create: unexpected argument "${extra[0] ?? out}"; only --json takes a file name`,
    );
  }
  const environment = text(parsed, 'env');
  const memoryMib = positiveInt('memory-mib', text(parsed, 'memory-mib'));
  const idleTtlMs = durationMs('idle-ttl', text(parsed, 'idle-ttl') ?? DEFAULT_IDLE_TTL);
  const deadlineMs = durationMs('deadline', text(parsed, 'deadline'));
  const request: SandboxRequest = {
    ...(environment ? { environment } : {}),
    ...(memoryMib ? { resources: { memoryMib } } : {}),
    lifetime: { idleTtlMs, ...(deadlineMs ? { deadlineMs } : {}) },
  };
  const created = await createKept(request);
  const record = { ...created, idleTtlMs, ...(deadlineMs ? { deadlineMs } : {}) };
  if (parsed.values['json']) {
    const document = JSON.stringify(record);
    if (out) await writeFileAtomic(out, `${document}\n`);
    else console.log(document);
  } else {
    console.log(record.id);
  }
  const owner = record.ownerPid === undefined ? 'its node' : `process ${record.ownerPid}`;
  console.error(
    `sandgym create: ${record.id} (${record.environment ?? record.backend}) held by ${owner}; it ends with "sandgym kill ${record.id}" or after ${text(parsed, 'idle-ttl') ?? DEFAULT_IDLE_TTL} unused`,
  );
  return EXIT.ok;
}

/** The sandbox made and left running: by the cluster's controller, else by a holder on this host. */
async function createKept(
  request: SandboxRequest,
): Promise<{ id: string; backend: string; environment?: string | undefined; ownerPid?: number | undefined }> {
  const cluster = await openCluster();
  if (!cluster) return startHolder(request);
  await using platform = cluster;
  const sandbox = await platform.createSandbox(request);
  platform.keep(sandbox);
  const environment = sandbox.labels['environment'];
  return { id: sandbox.id, backend: sandbox.backend, ...(environment ? { environment } : {}) };
}
