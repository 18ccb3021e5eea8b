import { Platform, parseEnvironmentRef } from '../../platform/index.ts';
import { parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';
import { openStore } from './layers.ts';

export const ENV_RM_COMMAND = {
  name: 'env rm',
  summary: 'forget an environment no live sandbox uses (layer gc then takes its layers)',
  operands: 'NAME:VERSION',
  details:
    "The project's own environment of that name, else the shared one. Refused, naming them, while\n" +
    'sandboxes on this host were made from it (exit 1).',
  options: {},
} as const satisfies CommandSpec;

/**
 * `sandgym env rm NAME:VERSION`: forgets an environment of this host's store, the project's own
 * or else a shared one (the host's root owns its store); refused, naming them, while sandboxes
 * on this node were made from it. Its layers stay until `layer gc` finds nothing using them.
 */
export async function envRemoveCommand(args: string[]): Promise<number> {
  const { positionals } = parseCommand(ENV_RM_COMMAND, args);
  const [given, ...extra] = positionals;
  if (!given || extra.length)
    throw new UsageError('sandgym env rm: give one environment, e.g. sandgym env rm mytool:1');
  const { name, version } = parseEnvironmentRef(given);
  const ref = `${name}:${version}`;
  const store = await openStore();
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
