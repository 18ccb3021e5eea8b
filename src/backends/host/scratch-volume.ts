import { existsSync, readFileSync } from 'node:fs';
import { mkdir, open, readdir, readFile, stat, statfs } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SandgymError } from '../../common/index.ts';
import type { HostHelper } from './host-helper.ts';
import { readMounts } from './mountinfo.ts';
import { runProgram } from './run-program.ts';

/** The most the sparse image may grow to; it takes host disk only as sandboxes write. */
const MAX_IMAGE_BYTES = 256 * 2 ** 30;
/** The least a volume is made with (btrfs needs room for its own trees). */
const MIN_IMAGE_BYTES = 256 * 2 ** 20;
/** Host disk the volume leaves to everything else on the host: a tenth of what is free, at most 1 GiB. */
const HOST_RESERVE_SHARE = 0.1;
const MAX_HOST_RESERVE_BYTES = 2 ** 30;

/** What the volume can hold and what it can still take, in bytes. */
export interface VolumeRoom {
  /** Everything it could hold: its own size, or less when the host disk under it cannot back that. */
  capacityBytes: number;
  /** What it can still take before writes fail: its own free space, or less, the host's. */
  freeBytes: number;
}

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
  private reading: Promise<VolumeRoom> | undefined;
  private reclaiming: Promise<VolumeRoom> | undefined;

  private constructor(
    readonly mountPoint: string,
    private readonly image: string,
    private readonly sysfsQgroups: string,
    private readonly helper: HostHelper,
  ) {}

  /** Mounts the volume (making its image first), or takes it as it is when a predecessor left it mounted. */
  static async open(mountPoint: string, image: string, helper: HostHelper): Promise<ScratchVolume> {
    await mountVolume(mountPoint, image);
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
      await mountVolume(this.mountPoint, this.image);
    }
    return { subvolumeId: await this.helper.subvolume(join(this.mountPoint, name, 'rw'), limitBytes) };
  }

  /** Changes a slot's cap (a pooled shell taking a tenant). */
  async setLimit(name: string, limitBytes: number): Promise<void> {
    await this.createSlot(name, limitBytes);
  }

  /** What a slot holds now, in bytes, read synchronously (see {@link usage}); undefined if unknown. */
  usedNow(slot: ScratchSlot): number | undefined {
    const dir = join(this.sysfsQgroups, `0_${slot.subvolumeId}`);
    try {
      return (
        Number(readFileSync(join(dir, 'referenced'), 'utf8')) +
        Number(readFileSync(join(dir, 'rsv_data'), 'utf8'))
      );
    } catch {
      return undefined;
    }
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

  /**
   * What the volume can hold and take now. The image is sparse: every byte btrfs writes into it
   * may need a byte of the host disk under it, and if the host runs out first the loop device
   * fails writes with EIO, which would break every sandbox on the node, not just the one that
   * filled it. So the host's free space (less its reserve) bounds both numbers.
   */
  room(): Promise<VolumeRoom> {
    // creates that arrive together (a burst) share one reading: it is as fresh for each of them
    this.reading ??= this.readRoom().finally(() => (this.reading = undefined));
    return this.reading;
  }

  /**
   * Frees now what deleted slots held, and reads the room after. btrfs deletes a subvolume in the
   * background: its space is free only after the next transaction commit (every 30 s) wakes the
   * cleaner, and the image gives the blocks back to the host disk only when they are discarded,
   * later still. So a volume one tenant emptied looked full to the next for up to half a minute.
   * A commit, a wait for the cleaner and a trim make it free at once (about 0.1 s); for the slow
   * path of a create that finds the volume full, never on every create.
   */
  reclaim(): Promise<VolumeRoom> {
    this.reclaiming ??= (async () => {
      await runProgram('btrfs', ['filesystem', 'sync', this.mountPoint]);
      await runProgram('btrfs', ['subvolume', 'sync', this.mountPoint]);
      await runProgram('btrfs', ['filesystem', 'sync', this.mountPoint]);
      await runProgram('fstrim', [this.mountPoint]);
      return this.readRoom();
    })().finally(() => (this.reclaiming = undefined));
    return this.reclaiming;
  }

  private async readRoom(): Promise<VolumeRoom> {
    const [volume, host, allocated] = await Promise.all([
      statfs(this.mountPoint),
      statfs(dirname(this.image)),
      stat(this.image).then((info) => info.blocks * 512),
    ]);
    const hostFree = Math.max(0, host.bavail * host.bsize - hostReserve(host.bavail * host.bsize));
    return {
      capacityBytes: Math.min(volume.blocks * volume.bsize, allocated + hostFree),
      freeBytes: Math.min(volume.bavail * volume.bsize, hostFree),
    };
  }

  /** Unmounts the volume when no slot is left on it; true when it did. The image and the empty mount point stay. */
  async closeIfEmpty({ settle = false }: { settle?: boolean } = {}): Promise<boolean> {
    let left = await readdir(this.mountPoint).catch(() => ['unreadable']);
    // with `settle` (its owner made slots), one whose removal is just finishing is waited for
    for (let wait = 0; settle && left.length > 0 && wait < CLOSE_WAIT_ROUNDS; wait++) {
      await sleep(50);
      left = await readdir(this.mountPoint).catch(() => ['unreadable']);
    }
    if (left.length > 0) return false;
    await runProgram('umount', [this.mountPoint]);
    return true;
  }
}

/** How many times (50 ms apart) closing looks again for the volume to empty. */
const CLOSE_WAIT_ROUNDS = 10;

/** The btrfs superblock magic, as statfs reports it. */
const BTRFS_SUPER_MAGIC = 0x9123683e;

/** Mounts the image on `mountPoint` (making the image first), unless it is mounted there already. */
async function mountVolume(mountPoint: string, image: string): Promise<void> {
  await mkdir(mountPoint, { recursive: true });
  if (!(await isMounted(mountPoint))) {
    const left = await readdir(mountPoint);
    if (left.length > 0) {
      throw new SandgymError(
        'failed_precondition',
        `${mountPoint} holds ${left.length} entries but is not the scratch volume (a data dir from an older sandgym?): stop its sandboxes and remove it`,
      );
    }
    if (!existsSync(image)) await makeImage(image);
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

/** The host disk kept free for everything but the volume. */
function hostReserve(freeBytes: number): number {
  return Math.min(MAX_HOST_RESERVE_BYTES, Math.floor(freeBytes * HOST_RESERVE_SHARE));
}

/**
 * A sparse image with btrfs on it: nothing is allocated until sandboxes write. It is made no
 * larger than the host disk under it can back (less a reserve), so a full volume fails writes
 * with ENOSPC, as a full disk does, rather than the host failing them under it with EIO.
 */
async function makeImage(image: string): Promise<void> {
  const host = await statfs(dirname(image));
  const free = host.bavail * host.bsize;
  const size =
    Math.floor(Math.max(MIN_IMAGE_BYTES, Math.min(MAX_IMAGE_BYTES, free - hostReserve(free))) / 4096) * 4096;
  const handle = await open(image, 'wx', 0o600); // every sandbox's writes: root's alone
  try {
    await handle.truncate(size);
  } finally {
    await handle.close();
  }
  await runProgram('mkfs.btrfs', ['-q', '-f', image]);
}
