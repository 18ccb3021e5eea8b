import { constants, existsSync } from 'node:fs';
import { access, chmod, mkdir, statfs } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { SandgymError } from '../../common/index.ts';

/** Kernel filesystems (statfs magic numbers) where no data folder can live. */
const KERNEL_FILESYSTEMS: Record<number, string> = {
  0x9fa0: 'procfs',
  0x62656572: 'sysfs',
  0x1cd1: 'devpts',
  0x27e0eb: 'cgroup',
  0x63677270: 'cgroup2',
  0x64626720: 'debugfs',
  0x74726163: 'tracefs',
  0x73636673: 'securityfs',
  0x6e736673: 'nsfs',
  0xcafe4a11: 'bpf',
  0xde5e81e4: 'efivarfs',
};

/**
 * Makes a folder sandgym keeps node data in (the data dir, the layer store), readable by root
 * only (0700: trajectories, the scratch volume image and the layers below it hold tenants' data),
 * after checking it can be one. The check comes first and names the setting to change: Node's
 * own recursive mkdir never returns on procfs, and a read-only mount would otherwise fail much
 * later, in the middle of a create.
 */
export async function prepareDataFolder(path: string, setting: string): Promise<string> {
  const folder = resolve(path);
  let existing = folder;
  while (!existsSync(existing)) existing = dirname(existing);
  const kind = KERNEL_FILESYSTEMS[(await statfs(existing)).type];
  if (kind) {
    throw new SandgymError(
      'invalid_argument',
      `${folder} is on ${kind}, a kernel filesystem that cannot hold files: set ${setting} to a folder on a disk`,
    );
  }
  await access(existing, constants.W_OK).catch((error: NodeJS.ErrnoException) => {
    throw new SandgymError(
      'invalid_argument',
      `${folder} cannot be written (${existing}: ${error.code === 'EROFS' ? 'a read-only filesystem' : error.code}): set ${setting} to a writable folder`,
      { cause: error },
    );
  });
  await mkdir(folder, { recursive: true, mode: 0o700 });
  await chmod(folder, 0o700);
  return folder;
}
