import { join, resolve } from 'node:path';
import {
  prepareDataFolder,
  accelerator,
  activeSwapAreas,
  agentBinaryPath,
  ensureCriu,
  ensureGuestKernel,
  ensureSwapFile,
  ensureVmImage,
  prepareHost,
  installPrograms,
  TEST_PROGRAMS,
} from '../../backends/index.ts';
import { consoleLogger } from '../console-logger.ts';
import { LayerStore, defaultDataDir, defaultStoreDir, ensureBaseEnvironments } from '../../platform/index.ts';
import { parseCommandArgs, positiveInt, text } from '../args.ts';
import { EXIT } from '../exit-codes.ts';

/**
 * `sandgym setup [--swap-mib N [--swap-file PATH]] [--criu] [--for-tests]`: Debian packages,
 * kernel checks, base layers, swap; with `--criu`, a CRIU that checkpoints containers' memory;
 * with `--for-tests`, also what the test suite runs beside sandgym. Idempotent.
 */
export async function setupCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('setup', args, {
    json: { type: 'boolean' },
    'swap-mib': { type: 'string' },
    'swap-file': { type: 'string' },
    'for-tests': { type: 'boolean' },
    criu: { type: 'boolean' },
  });
  const logger = consoleLogger();
  const mirror = process.env['SANDGYM_DEBIAN_MIRROR'] ?? 'http://deb.debian.org/debian';
  const prepared = await prepareHost(logger);
  // containers' memory checkpoints: built once from source where the host's CRIU cannot
  const host = parsed.values.criu
    ? { ...prepared, criu: await ensureCriu(join(defaultDataDir(), 'build'), mirror, logger) }
    : prepared;
  if (parsed.values['for-tests']) await installPrograms(TEST_PROGRAMS, logger);
  const { values } = parsed;
  const swapMib = positiveInt('swap-mib', text(parsed, 'swap-mib'));
  // a swap file lets hibernated sandboxes give up their anonymous memory, not just page cache
  const swapFile = swapMib
    ? resolve(text(parsed, 'swap-file') ?? join(defaultDataDir(), 'swapfile'))
    : undefined;
  if (swapFile && swapMib && (await ensureSwapFile(swapFile, swapMib))) {
    logger.info({ swapFile, swapMib }, 'swap file enabled for hibernation');
  }
  const store = await LayerStore.open(
    await prepareDataFolder(defaultStoreDir(defaultDataDir()), '$SANDGYM_STORE'),
  );
  const built = await ensureBaseEnvironments(store, logger);
  const environments = (await store.listEnvironments()).map((e) => `${e.name}:${e.version}`);
  // the microvm backend's guest kernel, kept beside the layers
  const guest = await ensureGuestKernel(join(store.root, 'guest'), logger);
  // and the vm backend's full Debian image (debootstrapped once; remade when the agent changes)
  await ensureVmImage(join(store.root, 'guest', 'vm'), agentBinaryPath(), mirror, logger);
  const vmAccel = await accelerator();
  const report = {
    ...host,
    store: store.root,
    builtEnvironments: built,
    environments,
    swap: await activeSwapAreas(),
    guestKernel: guest.version,
    vmAccelerator: vmAccel,
  };
  if (values.json) console.log(JSON.stringify(report));
  else {
    console.error(
      `sandgym setup: host ready (cgroups ${host.cgroups}${host.hybridCgroups ? ', hybrid' : ''}); ` +
        `environments: ${environments.join(', ')}${built.length ? ` (built ${built.join(', ')})` : ''}; ` +
        `swap: ${report.swap.map((a) => a.filename).join(', ') || 'none (--swap-mib N adds a swap file)'}; ` +
        `process checkpoints: ${host.criu.usable ? `criu ${host.criu.version}` : `no (${host.criu.reason})`}; ` +
        `microvm: Debian kernel ${guest.version} under ${vmAccel === 'kvm' ? 'KVM' : 'TCG emulation (no usable KVM)'}`,
    );
  }
  return EXIT.ok;
}
