import { existsSync } from 'node:fs';
import { mkdir, open, readdir, readFile, statfs } from 'node:fs/promises';
import { join } from 'node:path';
import { SandgymError } from '../../common/index.ts';
import type { HostHelper } from './host-helper.ts';
import { readMounts } from './mountinfo.ts';
import { runProgram } from './run-program.ts';

/** How big the sparse image may grow; it takes host disk only as sandboxes write. */
const DEFAULT_IMAGE_GIB = 256;

/** A slot's place on the volume and what it may write. */
export interface ScratchSlot {
  /** The btrfs subvolume id whose quota group counts the slot's writes. */
  subvolumeId: number;
}

/** What a slot has written, and its cap, in bytes. */
export interface ScratchUsage {
  usedBytes: number;
  limitBytes: number;
}

/**
 * The node's writable storage for sandboxes: one btrfs filesystem in a sparse image file,
 * loop-mounted on `<dataDir>/sandboxes`. Each container slot is a folder there (bundle, state,
 * channel FIFOs), and its `rw` is a subvolume with a quota group for the upper and work dirs.
 * Only `rw` is capped: on btrfs even a write to a FIFO updates its inode and would fail with
 * EDQUOT in a full subvolume, cutting the agent's channel. A sandbox that fills its cap gets EDQUOT and nothing else is
 * touched: not the node's disk, not a neighbour. btrfs because this kernel has quotas for neither
 * ext4 (no QFMT_V2) nor XFS (no XFS_QUOTA), and because a subvolume costs one ioctl, not a loop
 * device per sandbox.
 */
export class ScratchVolume {
  private constructor(
    readonly mountPoint: string,
    private readonly image: string,
    private readonly sysfsQgroups: string,
    private readonly helper: HostHelper,
  ) {}

  /** Mounts the volume (making its image first), or takes it as it is when a predecessor left it mounted. */
  static async open(
    mountPoint: string,
    image: string,
    helper: HostHelper,
    imageGib = DEFAULT_IMAGE_GIB,
  ): Promise<ScratchVolume> {
    await mountVolume(mountPoint, image, imageGib);
    const uuid = (await runProgram('btrfs', ['filesystem', 'show', '--raw', mountPoint])).match(
      /uuid: ([0-9a-f-]{36})/,
    )?.[1];
    if (!uuid) throw new SandgymError('platform_error', `Cannot read the btrfs uuid of ${mountPoint}`);
    return new ScratchVolume(mountPoint, image, `/sys/fs/btrfs/${uuid}/qgroups`, helper);
  }

  /**
   * Makes slot `name` with its `rw` subvolume capped at `limitBytes`, unless it has one already.
   * The volume is mounted again first if another process on the data dir unmounted it when it
   * found it empty (see {@link closeIfEmpty}).
   */
  async createSlot(name: string, limitBytes: number | 'none'): Promise<ScratchSlot> {
    if ((await statfs(this.mountPoint)).type !== BTRFS_SUPER_MAGIC) {
      await mountVolume(this.mountPoint, this.image, DEFAULT_IMAGE_GIB);
    }
    return { subvolumeId: await this.helper.subvolume(join(this.mountPoint, name, 'rw'), limitBytes) };
  }

  /** Changes a slot's cap (a pooled shell taking a tenant). */
  async setLimit(name: string, limitBytes: number): Promise<void> {
    await this.createSlot(name, limitBytes);
  }

  /**
   * What a slot holds now, from the kernel's quota group (its counters lag writes by up to a
   * transaction commit; a write refused for the cap commits first, so a full slot reads as full).
   */
  async usage(slot: ScratchSlot): Promise<ScratchUsage | undefined> {
    const dir = join(this.sysfsQgroups, `0_${slot.subvolumeId}`);
    try {
      const [used, reserved, limit] = await Promise.all(
        ['referenced', 'rsv_data', 'max_referenced'].map((f) => readFile(join(dir, f), 'utf8')),
      );
      return { usedBytes: Number(used) + Number(reserved), limitBytes: Number(limit) };
    } catch {
      return undefined;
    }
  }

  /** Unmounts the volume when no slot is left on it; true when it did. The image and the empty mount point stay. */
  async closeIfEmpty(): Promise<boolean> {
    const left = await readdir(this.mountPoint).catch(() => ['unreadable']);
    if (left.length > 0) return false;
    await runProgram('umount', [this.mountPoint]);
    return true;
  }
}

/** The btrfs superblock magic, as statfs reports it. */
const BTRFS_SUPER_MAGIC = 0x9123683e;

/** Mounts the image on `mountPoint` (making the image first), unless it is mounted there already. */
async function mountVolume(mountPoint: string, image: string, imageGib: number): Promise<void> {
  await mkdir(mountPoint, { recursive: true });
  if (!(await isMounted(mountPoint))) {
    const left = await readdir(mountPoint);
    if (left.length > 0) {
      throw new SandgymError(
        'failed_precondition',
        `${mountPoint} holds ${left.length} entries but is not the scratch volume (a data dir from an older sandgym?): stop its sandboxes and remove it`,
      );
    }
    if (!existsSync(image)) await makeImage(image, imageGib);
    // discard gives deleted files' blocks back to the host's filesystem
    const mounted = await runProgram('mount', ['-o', 'loop,discard=async,noatime', image, mountPoint]).then(
      () => true,
      async (error: unknown) => {
        // another process on the data dir mounted it at the same moment: theirs serves both
        if (await isMounted(mountPoint)) return false;
        throw error;
      },
    );
    if (mounted) await runProgram('btrfs', ['quota', 'enable', mountPoint]);
  }
}

async function isMounted(path: string): Promise<boolean> {
  return (await readMounts()).some((m) => m.mountPoint === path);
}

/** A sparse image with btrfs on it: nothing is allocated until sandboxes write. */
async function makeImage(image: string, sizeGib: number): Promise<void> {
  const handle = await open(image, 'wx', 0o600); // every sandbox's writes: root's alone
  try {
    await handle.truncate(sizeGib * 2 ** 30);
  } finally {
    await handle.close();
  }
  await runProgram('mkfs.btrfs', ['-q', '-f', image]);
}
