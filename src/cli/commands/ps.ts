import { killLocalSandbox } from '../held-sandboxes.ts';
import { openCluster, openPlatform } from './cluster.ts';
import { jsonOutput } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

export const PS_COMMAND = {
  name: 'ps',
  summary: 'live sandboxes on this node (or the cluster at $SANDGYM_PLATFORM)',
  options: { ...JSON_OPTION },
} as const satisfies CommandSpec;

/** `sandgym ps [--json [OUT]]`: the sandboxes on this node, from every process. */
export async function psCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(PS_COMMAND, args);
  const json = await jsonOutput(parsed);
  await using platform = await openPlatform();
  const records = await platform.listSandboxes();
  if (json) {
    await json.write({ sandboxes: records });
    return EXIT.ok;
  }
  console.log(
    ['ID'.padEnd(26), 'BACKEND'.padEnd(10), 'STATE'.padEnd(9), 'OWNER'.padEnd(8), 'CREATED', 'ENV'].join(' '),
  );
  for (const r of records) {
    console.log(
      [
        r.id.padEnd(26),
        r.backend.padEnd(10),
        r.state.padEnd(9),
        String(r.ownerPid).padEnd(8),
        r.createdAt,
        r.labels['environment'] ?? '',
      ].join(' '),
    );
  }
  return EXIT.ok;
}

export const KILL_COMMAND = {
  name: 'kill',
  summary: "destroy this project's sandboxes ($SANDGYM_PROJECT), whichever process owns them",
  operands: 'ID ...',
  details: 'An id that names no sandbox is bad input: exit 2.',
  options: {},
} as const satisfies CommandSpec;

/** `sandgym kill ID ...`: destroys sandboxes, whichever process owns them. */
export async function killCommand(args: string[]): Promise<number> {
  const { positionals } = parseCommand(KILL_COMMAND, args);
  if (positionals.length === 0)
    throw new UsageError('sandgym kill: give the id of a sandbox (see sandgym ps)');
  const cluster = await openCluster();
  if (!cluster) {
    for (const id of positionals) await killLocalSandbox(id);
    return EXIT.ok;
  }
  await using platform = cluster;
  for (const id of positionals) await platform.killSandbox(id);
  return EXIT.ok;
}

export const GC_COMMAND = {
  name: 'gc',
  summary: 'reap what crashed owners left behind: sandboxes, cgroups, runtime state, idle mounts',
  options: { ...JSON_OPTION },
} as const satisfies CommandSpec;

/** `sandgym gc`: reaps what crashed owners left: sandboxes, cgroups, runtime state, idle layer mounts. */
export async function gcCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(GC_COMMAND, args);
  const json = await jsonOutput(parsed);
  await using platform = await openPlatform();
  const report = await platform.gc();
  if (json) await json.write(report);
  else {
    console.error(
      `sandgym gc: removed ${report.sandboxes.length} sandboxes, ${report.cgroups.length} cgroups, ${report.mounts.length} layer mounts`,
    );
  }
  return EXIT.ok;
}
