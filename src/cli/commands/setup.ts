import { prepareHost } from '../../backends/index.ts';
import { consoleLogger } from '../console-logger.ts';
import { LayerStore, defaultDataDir, defaultStoreDir, ensureBaseEnvironments } from '../../platform/index.ts';
import { parseCommandArgs } from '../args.ts';
import { EXIT } from '../exit-codes.ts';

/** `sandgym setup`: Debian packages, kernel checks, base layers. Idempotent. */
export async function setupCommand(args: string[]): Promise<number> {
  const { values } = parseCommandArgs('setup', args, { json: { type: 'boolean' } });
  const logger = consoleLogger();
  const host = await prepareHost(logger);
  const store = await LayerStore.open(defaultStoreDir(defaultDataDir()));
  const built = await ensureBaseEnvironments(store, logger);
  const environments = (await store.listEnvironments()).map((e) => `${e.name}:${e.version}`);
  const report = { ...host, store: store.root, builtEnvironments: built, environments };
  if (values.json) console.log(JSON.stringify(report));
  else {
    console.error(
      `sandgym setup: host ready (cgroups ${host.cgroups}${host.hybridCgroups ? ', hybrid' : ''}); ` +
        `environments: ${environments.join(', ')}${built.length ? ` (built ${built.join(', ')})` : ''}`,
    );
  }
  return EXIT.ok;
}
