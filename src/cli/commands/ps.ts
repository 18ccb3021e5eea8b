import { killLocalSandbox } from '../held-sandboxes.ts';
import { openCluster, openPlatform } from './cluster.ts';
import { parseCommandArgs } from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/** `sandgym ps [--json]`: the sandboxes on this node, from every process. */
export async function psCommand(args: string[]): Promise<number> {
  const { values } = parseCommandArgs('ps', args, { json: { type: 'boolean' } });
  await using platform = await openPlatform();
  const records = await platform.listSandboxes();
  if (values.json) {
    console.log(JSON.stringify({ sandboxes: records }));
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

/** `sandgym kill ID`: destroys a sandbox, whichever process owns it. */
export async function killCommand(args: string[]): Promise<number> {
  const { positionals } = parseCommandArgs('kill', args, {});
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

/** `sandgym gc`: reaps what crashed owners left: sandboxes, cgroups, runtime state, idle layer mounts. */
export async function gcCommand(args: string[]): Promise<number> {
  const { values } = parseCommandArgs('gc', args, { json: { type: 'boolean' } });
  await using platform = await openPlatform();
  const report = await platform.gc();
  if (values.json) console.log(JSON.stringify(report));
  else {
    console.error(
      `sandgym gc: removed ${report.sandboxes.length} sandboxes, ${report.cgroups.length} cgroups, ${report.mounts.length} layer mounts`,
    );
  }
  return EXIT.ok;
}
