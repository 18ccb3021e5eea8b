import { Platform, parseEnvironmentRef, type ProjectStore } from '../../platform/index.ts';
import { parseCommandArgs } from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/**
 * `sandgym env rm NAME:VERSION`: forgets an environment of this host's store, the project's own
 * or else a shared one (the host's root owns its store); refused, naming them, while sandboxes
 * on this node were made from it. Its layers stay until `layer gc` finds nothing using them.
 */
export async function envRemove(store: ProjectStore, args: string[]): Promise<number> {
  const { positionals } = parseCommandArgs('env rm', args, {});
  const [given, ...extra] = positionals;
  if (!given || extra.length)
    throw new UsageError('sandgym env rm: give one environment, e.g. sandgym env rm mytool:1');
  const { name, version } = parseEnvironmentRef(given);
  const ref = `${name}:${version}`;
  await store.getEnvironment(ref); // not_found names the ones there are
  // every process's sandboxes on this node, orphans too: they still stand on its layers
  const users = await (async () => {
    await using platform = await Platform.local();
    return (await platform.listSandboxes()).filter((record) => record.labels['environment'] === ref);
  })();
  if (users.length) {
    const named = users.map((record) => `${record.id} (${record.state}, process ${record.ownerPid})`);
    console.error(
      `sandgym env rm: ${ref} is in use by ${users.length} sandbox(es): ${named.join(', ')}; end them first (sandgym kill ID, or sandgym gc for orphaned ones)`,
    );
    return EXIT.failed;
  }
  const own = (await store.ownEnvironments()).some((e) => e.name === name && e.version === version);
  await (own ? store.removeEnvironment(ref) : store.layers.removeEnvironment(ref));
  console.error(`sandgym env rm: removed ${ref}; "sandgym layer gc" reclaims layers nothing else uses`);
  return EXIT.ok;
}
