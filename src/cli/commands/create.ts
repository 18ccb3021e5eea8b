import type { SandboxRequest } from '../../platform/index.ts';
import { SANDBOX_LIMITS } from '../../platform/index.ts';
import { HOST_MEMORY_MIB, durationMs, jsonOutput, numberOf, text } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT } from '../exit-codes.ts';
import { startHolder } from '../held-sandboxes.ts';
import { openCluster } from './cluster.ts';

/** How long a created sandbox may sit unused before it is reclaimed, unless --idle-ttl says otherwise. */
const DEFAULT_IDLE_TTL = '1h';

export const CREATE_COMMAND = {
  name: 'create',
  summary: 'a sandbox that stays, like docker run -d: its id on stdout',
  details:
    'It ends with sandgym kill ID, or once unused for its idle TTL, or at its deadline. On this host\n' +
    'a detached holder process owns it; on the cluster at $SANDGYM_PLATFORM, its node does.',
  options: {
    env: { type: 'string', value: 'NAME:VERSION', description: 'the environment (default debian:bookworm)' },
    'memory-mib': {
      type: 'integer',
      range: [
        SANDBOX_LIMITS.minMemoryMib,
        process.env['SANDGYM_PLATFORM']
          ? SANDBOX_LIMITS.maxMemoryMib
          : Math.min(HOST_MEMORY_MIB, SANDBOX_LIMITS.maxMemoryMib),
      ],
      description: "the sandbox's memory limit",
    },
    'idle-ttl': {
      type: 'string',
      value: 'DURATION',
      default: DEFAULT_IDLE_TTL,
      description: 'how long it may go unused before it is reclaimed',
    },
    deadline: { type: 'string', value: 'DURATION', description: 'how long it may live at most' },
    ...JSON_OPTION,
  },
} as const satisfies CommandSpec;

/**
 * `sandgym create [--env E] [--memory-mib N] [--idle-ttl D] [--deadline D] [--json [OUT]]`: a
 * sandbox that outlives this command, like `docker run -d`; its id on stdout. On this host a
 * detached holder process owns it (see held-sandboxes.ts); on a cluster its node does. Either way
 * it ends when killed, or once unused for its idle TTL, or at its deadline.
 */
export async function createCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(CREATE_COMMAND, args);
  const json = await jsonOutput(parsed);
  const environment = text(parsed, 'env');
  const memoryMib = numberOf(parsed, 'memory-mib');
  const idleTtlMs = durationMs('idle-ttl', text(parsed, 'idle-ttl') ?? DEFAULT_IDLE_TTL);
  const deadlineMs = durationMs('deadline', text(parsed, 'deadline'));
  const request: SandboxRequest = {
    ...(environment ? { environment } : {}),
    ...(memoryMib ? { resources: { memoryMib } } : {}),
    lifetime: { idleTtlMs, ...(deadlineMs ? { deadlineMs } : {}) },
  };
  const created = await createKept(request);
  const record = { ...created, idleTtlMs, ...(deadlineMs ? { deadlineMs } : {}) };
  if (json) await json.write(record);
  else console.log(record.id);
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
