import { totalmem } from 'node:os';
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
  type CriuSupport,
} from '../../backends/index.ts';
import { messageOf, type Logger } from '../../common/index.ts';
import { consoleLogger } from '../console-logger.ts';
import { LayerStore, defaultDataDir, defaultStoreDir, ensureBaseEnvironments } from '../../platform/index.ts';
import { flag, jsonOutput, numberOf, text } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT } from '../exit-codes.ts';

/** The swap file made when CRIU cannot work: a quarter of memory, at most 4 GiB. */
const DEFAULT_SWAP_MIB = Math.max(256, Math.min(4096, Math.floor(totalmem() / 4 / 2 ** 20)));

export const SETUP_COMMAND = {
  name: 'setup',
  summary: 'prepare this host: Debian packages, kernel checks, base layers, CRIU or a swap file',
  details: 'Idempotent; run as root. Without a usable CRIU (and no swap), a swap file is made.',
  options: {
    'swap-mib': {
      type: 'integer',
      range: [16, 1_048_576],
      description: `make a swap file this big; without it, ${DEFAULT_SWAP_MIB} MiB when there is no CRIU and no swap`,
    },
    'swap-file': {
      type: 'string',
      value: 'PATH',
      description: "the swap file's path (default DATA_DIR/swapfile)",
    },
    'for-tests': { type: 'boolean', description: 'also what the test suite runs beside sandgym' },
    criu: {
      type: 'boolean',
      description: 'build CRIU where the host has none (the default; kept for old scripts)',
    },
    'no-criu': { type: 'boolean', description: 'no CRIU: hibernation pages memory out to swap' },
    'no-swap': { type: 'boolean', description: 'make no swap file' },
    ...JSON_OPTION,
  },
} as const satisfies CommandSpec;

/**
 * `sandgym setup [--swap-mib N [--swap-file PATH]] [--no-criu] [--no-swap] [--for-tests]`:
 * Debian packages, kernel checks, base layers, and memory checkpoints for preempted sandboxes:
 * a CRIU that checkpoints containers' memory (built from source where the host has none), or,
 * where CRIU cannot work, a swap file that hibernated sandboxes page out to. With `--for-tests`,
 * also what the test suite runs beside sandgym. Idempotent.
 */
export async function setupCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(SETUP_COMMAND, args);
  const json = await jsonOutput(parsed);
  const logger = consoleLogger();
  const mirror = process.env['SANDGYM_DEBIAN_MIRROR'] ?? 'http://deb.debian.org/debian';
  const prepared = await prepareHost(logger);
  // containers' memory checkpoints by default (phases that free memory are the product): built
  // once from source where the host's CRIU cannot; a build that fails leaves swap to do it
  const host = flag(parsed, 'no-criu') ? prepared : { ...prepared, criu: await criuOrWhyNot(mirror, logger) };
  if (flag(parsed, 'for-tests')) await installPrograms(TEST_PROGRAMS, logger);
  const askedSwapMib = numberOf(parsed, 'swap-mib');
  // without CRIU, a hibernated container can only give its memory up to swap: make some
  const swapMib =
    askedSwapMib ??
    (!host.criu.usable && !flag(parsed, 'no-swap') && (await activeSwapAreas()).length === 0
      ? DEFAULT_SWAP_MIB
      : undefined);
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
  if (json) await json.write(report);
  else {
    console.error(
      `sandgym setup: host ready (cgroups ${host.cgroups}${host.hybridCgroups ? ', hybrid' : ''}); ` +
        `environments: ${environments.join(', ')}${built.length ? ` (built ${built.join(', ')})` : ''}; ` +
        `swap: ${report.swap.map((a) => a.filename).join(', ') || 'none (--swap-mib N adds a swap file)'}; ` +
        `preempted containers' memory: ${memoryCheckpoints(host.criu.usable, report.swap.length > 0)}; ` +
        `process checkpoints: ${host.criu.usable ? `criu ${host.criu.version}` : `no (${host.criu.reason})`}; ` +
        `microvm: Debian kernel ${guest.version} under ${vmAccel === 'kvm' ? 'KVM' : 'TCG emulation (no usable KVM)'}`,
    );
  }
  return EXIT.ok;
}

/** Builds CRIU where the host lacks a usable one; a failure is a reason, not a failed setup. */
async function criuOrWhyNot(mirror: string, logger: Logger): Promise<CriuSupport> {
  try {
    return await ensureCriu(join(defaultDataDir(), 'build'), mirror, logger);
  } catch (error) {
    const reason = `building CRIU failed: ${messageOf(error)}`;
    logger.warn({ reason }, 'no process checkpoints: hibernation falls back to swap');
    return { usable: false, version: undefined, reason };
  }
}

/** What hibernating a container does with its memory on this host, in a user's words. */
function memoryCheckpoints(criu: boolean, swap: boolean): string {
  if (criu) return 'checkpointed to disk by CRIU and freed';
  if (swap) return 'paged out to swap (no CRIU)';
  return 'KEPT: no CRIU and no swap, so hibernating frees nothing (drop --no-criu/--no-swap)';
}
