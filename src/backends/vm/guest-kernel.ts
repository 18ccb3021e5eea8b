import { spawnSync } from 'node:child_process';
import { readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { z } from 'zod';
import { SandgymError, type Logger } from '../../common/index.ts';
import { runProgram } from '../host/run-program.ts';
import { buildFolderOnce } from './build-once.ts';
import { cpioArchive, type CpioEntry } from './cpio.ts';

/**
 * Kernel modules the guest init loads, in this order with their dependencies first: crc32c, virtio
 * transports (MMIO for microvm, PCI for q35), disks, the agent's serial port, entropy, and the
 * filesystems of the root (EROFS layers, an ext4 writable disk, overlayfs over them).
 */
const GUEST_MODULES = [
  // libcrc32c (for EROFS and ext4) asks the crypto API for crc32c, which a module provides
  'crc32c_generic',
  'virtio_mmio',
  'virtio_pci',
  'virtio_blk',
  'virtio_console',
  'virtio-rng',
  'erofs',
  'ext4',
  'overlay',
];

/** A guest kernel ready to boot: an uncompressed vmlinux (PVH boot) and the modules' initramfs. */
export interface GuestKernel {
  version: string;
  vmlinux: string;
  /** A cpio archive of /modules/*.ko and /modules/order; the per-VM archive (with /init) follows it. */
  modulesArchive: string;
}

const readyFile = z.object({ version: z.string() });

/**
 * The guest kernel in `dir`, fetched and prepared on first use: Debian's `linux-image-amd64`,
 * downloaded (not installed) with apt, its bzImage decompressed to a vmlinux for PVH boot (about
 * twice as fast to boot under TCG as the bzImage), and the modules the init needs packed into an
 * archive with their load order. Made in a temp folder and renamed, so concurrent first uses and
 * crashes leave either nothing or a whole kernel.
 */
export async function ensureGuestKernel(dir: string, logger: Logger): Promise<GuestKernel> {
  const existing = await readReady(dir);
  if (existing) return existing;
  await buildFolderOnce(join(dir, 'current'), 'ready.json', async (work) => {
    logger.info({ dir }, 'preparing the guest kernel (Debian linux-image-amd64)');
    const depends = await runProgram('apt-cache', ['depends', 'linux-image-amd64']);
    const pkg = /Depends: (linux-image-[0-9][^\s]*)/.exec(depends)?.[1];
    if (!pkg)
      throw new SandgymError(
        'failed_precondition',
        `Cannot find Debian's kernel package: apt-cache said ${depends.trim()}; run "sandgym setup"`,
      );
    await runProgram('sh', ['-c', 'cd "$1" && apt-get download -q "$2" >/dev/null', 'sh', work, pkg], {
      timeoutMs: 10 * 60_000,
    });
    const deb = (await readdir(work)).find((f) => f.endsWith('.deb'));
    if (!deb) throw new SandgymError('platform_error', `apt-get download ${pkg} left no .deb in ${work}`);
    const tree = join(work, 'tree');
    await runProgram('dpkg-deb', ['-x', join(work, deb), tree]);
    const version = (await readdir(join(tree, 'lib', 'modules')))[0];
    if (!version) throw new SandgymError('platform_error', `${pkg} holds no modules`);
    await writeFile(
      join(work, 'vmlinux'),
      decompressBzImage(await readFile(join(tree, 'boot', `vmlinuz-${version}`))),
    );
    await writeFile(join(work, 'modules.cpio'), await modulesArchive(join(tree, 'lib', 'modules', version)));
    await rm(tree, { recursive: true, force: true });
    await rm(join(work, deb), { force: true });
    await writeFile(join(work, 'ready.json'), JSON.stringify({ version }));
  });
  const ready = await readReady(dir);
  if (!ready) throw new SandgymError('platform_error', `The guest kernel in ${dir} did not come out whole`);
  return ready;
}

async function readReady(dir: string): Promise<GuestKernel | undefined> {
  const current = join(dir, 'current');
  try {
    const { version } = readyFile.parse(JSON.parse(await readFile(join(current, 'ready.json'), 'utf8')));
    return { version, vmlinux: join(current, 'vmlinux'), modulesArchive: join(current, 'modules.cpio') };
  } catch {
    return undefined;
  }
}

/** The kernel inside a bzImage: Debian compresses it with xz; the stream starts at xz's magic. */
function decompressBzImage(bzImage: Buffer): Buffer {
  const start = bzImage.indexOf(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]));
  if (start < 0)
    throw new SandgymError(
      'platform_error',
      'The guest kernel is not xz-compressed; cannot extract its vmlinux',
    );
  const xz = spawnSync('xz', ['-dc', '--single-stream'], {
    input: bzImage.subarray(start),
    maxBuffer: 512 * 2 ** 20,
  });
  if (xz.status !== 0 || xz.stdout.length === 0) {
    throw new SandgymError(
      'platform_error',
      `Cannot decompress the guest kernel: ${xz.stderr?.toString().trim() || xz.error?.message}`,
    );
  }
  return xz.stdout;
}

/** Every `.ko` below `dir`, by module name (`virtio-rng` and `virtio_rng` alike). */
async function moduleFiles(dir: string): Promise<Map<string, string>> {
  const found = new Map<string, string>();
  const walk = async (at: string): Promise<void> => {
    for (const entry of await readdir(at, { withFileTypes: true })) {
      const path = join(at, entry.name);
      if (entry.isDirectory()) await walk(path);
      else if (entry.name.endsWith('.ko')) found.set(entry.name.slice(0, -3).replaceAll('-', '_'), path);
    }
  };
  await walk(dir);
  return found;
}

/** A module's dependencies, from its `.modinfo` section (`depends=a,b`); no depmod needed. */
function dependsOf(ko: Buffer): string[] {
  const at = ko.indexOf('\0depends=');
  if (at < 0) return [];
  const end = ko.indexOf(0, at + 1);
  const list = ko.subarray(at + '\0depends='.length, end).toString();
  return list ? list.split(',').map((name) => name.replaceAll('-', '_')) : [];
}

async function modulesArchive(modulesDir: string): Promise<Buffer> {
  const files = await moduleFiles(modulesDir);
  const order: string[] = [];
  const entries: CpioEntry[] = [{ path: 'modules', kind: 'dir' }];
  const visit = async (name: string, chain: string[]): Promise<void> => {
    if (order.includes(name)) return;
    const path = files.get(name);
    if (!path)
      throw new SandgymError(
        'platform_error',
        `The guest kernel has no module ${name} (needed by ${chain.join(' <- ') || 'the init'})`,
      );
    const ko = await readFile(path);
    for (const dependency of dependsOf(ko)) await visit(dependency, [name, ...chain]);
    order.push(name);
    entries.push({ path: `modules/${basename(path)}`, kind: 'file', data: ko });
  };
  for (const name of GUEST_MODULES) await visit(name.replaceAll('-', '_'), []);
  const names = new Map([...files].map(([name, path]) => [name, basename(path)]));
  entries.push({
    path: 'modules/order',
    kind: 'file',
    data: Buffer.from(order.map((n) => names.get(n)).join('\n') + '\n'),
  });
  return cpioArchive(entries);
}
