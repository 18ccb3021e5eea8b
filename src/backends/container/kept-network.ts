import { constants, openSync } from 'node:fs';
import { stat, statfs, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandgymError } from '../../common/index.ts';
import { readMounts } from '../host/mountinfo.ts';
import { runProgram } from '../host/run-program.ts';

/**
 * A hibernated container's network namespace, kept while its processes are on disk. CRIU would
 * otherwise dump the namespace and build a new one on restore: the kernel's namespace set-up plus
 * the `ip` and `iptables` programs CRIU runs to refill it took ~50 ms of a ~90 ms restore here.
 * An idle namespace holding nothing but its loopback costs the host a few pages, against the
 * sandbox's whole memory freed; and a kept namespace is the one the sandbox had, rules and all,
 * not a copy.
 *
 * The namespace is held by a bind mount of its nsfs file in the image's folder (root's only),
 * so it outlives the node process that hibernated it: a successor that adopts the sandbox
 * restores into it. A host restart ends it, as it ends the cgroups the sandbox was in.
 */

/** CRIU's key for the namespace, the same at dump and restore. */
const NETWORK_KEY = 'sandgym-net';

/** statfs's magic number for nsfs: what a kept namespace's file is while it is held. */
const NSFS_MAGIC = 0x6e736673;

function keptFile(imageDir: string): string {
  return join(imageDir, 'netns');
}

/**
 * Holds `initPid`'s network namespace in `imageDir` and returns the dump options that leave it
 * out of the image, named as external.
 */
export async function keepNetwork(initPid: number, imageDir: string): Promise<string[]> {
  const namespace = `/proc/${initPid}/ns/net`;
  const { ino } = await stat(namespace);
  await writeFile(keptFile(imageDir), '', { mode: 0o600 });
  await runProgram('mount', ['--bind', namespace, keptFile(imageDir)]);
  return ['--external', `net[${ino}]:${NETWORK_KEY}`];
}

/**
 * Opens the namespace `imageDir` keeps, for a restore to inherit; the restore options that
 * name it. Fails, saying why, when the namespace is gone (the host restarted since).
 */
export async function openKeptNetwork(
  imageDir: string,
  fdNumber: number,
): Promise<{ fd: number; args: string[] }> {
  const held = await statfs(keptFile(imageDir)).catch(() => undefined);
  if (held?.type !== NSFS_MAGIC) {
    throw new SandgymError(
      'failed_precondition',
      'The network namespace the sandbox hibernated with is gone (the host restarted since): its processes cannot be restored',
    );
  }
  const fd = openSync(keptFile(imageDir), constants.O_RDONLY);
  return { fd, args: ['--inherit-fd', `fd[${fdNumber}]:${NETWORK_KEY}`] };
}

/** Lets go of the namespace `imageDir` keeps (restored processes hold their own reference). */
export async function releaseKeptNetwork(imageDir: string): Promise<void> {
  const held = await statfs(keptFile(imageDir)).catch(() => undefined);
  if (held?.type === NSFS_MAGIC) await runProgram('umount', [keptFile(imageDir)]);
}

/**
 * Lets go of every namespace kept under `dir` (a sandbox's folder, removed with the sandbox),
 * so that nothing is left mounted and the folder can go.
 */
export async function releaseKeptNetworksUnder(dir: string): Promise<void> {
  const kept = (await readMounts()).filter(
    (mount) => mount.fsType === 'nsfs' && mount.mountPoint.startsWith(`${dir}/`),
  );
  for (const mount of kept) await runProgram('umount', [mount.mountPoint]);
}
