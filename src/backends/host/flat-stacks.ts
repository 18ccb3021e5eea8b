import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readFile, readdir, rename, rm, stat, utimes } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { SandgymError, writeFileAtomic } from '../../common/index.ts';
import type { LayerImage } from '../contract.ts';
import { SingleFlight } from '../internal/single-flight.ts';
import { buildErofsImage } from './erofs.ts';
import { sha256OfFile } from './layer-verify.ts';

/** A container's deepest stack before its base is flattened: mount cost grows with each layer. */
export const CONTAINER_MAX_DEPTH = 32;
/**
 * A microvm's deepest stack: QEMU's microvm has 24 virtio-mmio slots, and the writable disk, the
 * serial port and the rng take three (MAX_LAYERS in agent/vminit.c).
 */
export const MICROVM_MAX_DEPTH = 21;
/**
 * Flattened prefixes are multiples of this many layers: a build's steps 33 to 48 share one
 * flattened image of layers 1 to 32, and the image of 1 to 48 is made from it and 16 more.
 */
const CHUNK = 16;
/** What the node keeps of flattened images by default. */
const DEFAULT_FLAT_CAP_BYTES = 8 * 2 ** 30;

/** Mounts and unmounts layer stacks of at most CHUNK + 1 layers, as a read-only merged tree. */
export type StackView = <T>(
  layers: readonly LayerImage[],
  consume: (root: string) => Promise<T>,
) => Promise<T>;

const indexSchema = z.object({ digest: z.string().regex(/^sha256:[0-9a-f]{64}$/), sizeBytes: z.number() });

/**
 * Deep layer stacks made shallow: the layers below the top few of a stack deeper than a backend
 * takes are merged into one EROFS image (the merged tree of an overlay of them, where whiteouts
 * have already hidden what they delete: it is the bottom of the stack, so nothing lies below for
 * them to hide). Images are cached on the node by the prefix's digests, made incrementally from
 * the previous chunk's image, and kept under a byte cap, least recently used going first; an
 * image a mount still uses is never removed (see {@link removeIdle}).
 */
export class FlatStacks {
  private readonly building = new SingleFlight<LayerImage>();

  constructor(
    private readonly dir: string,
    private readonly view: StackView,
    private readonly capBytes = DEFAULT_FLAT_CAP_BYTES,
  ) {}

  /**
   * The stack to mount for `layers` (base first), at most `maxDepth` deep: the same layers when
   * they fit, else one flattened image of a prefix and the layers above it.
   */
  async physical(layers: readonly LayerImage[], maxDepth: number): Promise<LayerImage[]> {
    if (layers.length <= maxDepth) return [...layers];
    if (maxDepth < CHUNK + 1)
      throw new SandgymError('invalid_argument', `A stack depth limit of ${maxDepth} is below ${CHUNK + 1}`);
    const prefix = Math.floor((layers.length - 1) / CHUNK) * CHUNK;
    return [await this.flatten(layers.slice(0, prefix)), ...layers.slice(prefix)];
  }

  /** The key of a stack's flattened image: its layers' digests, in order. */
  static keyOf(layers: readonly LayerImage[]): string {
    const hash = createHash('sha256').update('sandgym-flat-v1');
    for (const layer of layers) hash.update(`\n${layer.digest}`);
    return hash.digest('hex');
  }

  private flatten(prefix: readonly LayerImage[]): Promise<LayerImage> {
    const key = FlatStacks.keyOf(prefix);
    return this.building.run(key, async () => (await this.cached(key)) ?? this.build(key, prefix));
  }

  private imagePath(digest: string): string {
    return join(this.dir, `${digest.slice('sha256:'.length)}.erofs`);
  }

  private async cached(key: string): Promise<LayerImage | undefined> {
    try {
      const index = indexSchema.parse(
        JSON.parse(await readFile(join(this.dir, 'stacks', `${key}.json`), 'utf8')),
      );
      const path = this.imagePath(index.digest);
      // its use, for the cap's least-recently-used order; the mtime stays, which the verifier's cache checks
      const info = await stat(path);
      await utimes(path, new Date(), info.mtime);
      return { digest: index.digest, path, sizeBytes: index.sizeBytes };
    } catch {
      return undefined; // never made, or removed by the cap: make it (again)
    }
  }

  private async build(key: string, prefix: readonly LayerImage[]): Promise<LayerImage> {
    // the image of the chunks below, and this chunk's layers over it: at most CHUNK + 1 to mount
    const below =
      prefix.length > CHUNK ? [await this.flatten(prefix.slice(0, -CHUNK)), ...prefix.slice(-CHUNK)] : prefix;
    await mkdir(join(this.dir, 'stacks'), { recursive: true });
    const temp = join(this.dir, `.building-${randomBytes(6).toString('hex')}.erofs`);
    try {
      await this.view(below, (root) => buildErofsImage(root, temp, { fast: true }));
      const file = await open(temp, 'r');
      await file.sync();
      await file.close();
      const digest = await sha256OfFile(temp);
      const sizeBytes = (await stat(temp)).size;
      await this.makeRoom(sizeBytes);
      await rename(temp, this.imagePath(digest));
      await writeFileAtomic(join(this.dir, 'stacks', `${key}.json`), JSON.stringify({ digest, sizeBytes }));
      return { digest, path: this.imagePath(digest), sizeBytes };
    } finally {
      await rm(temp, { force: true });
    }
  }

  /** Removes idle images, least recently used first, until `bytes` more fit the cap. */
  private async makeRoom(bytes: number): Promise<void> {
    const images = await this.images();
    let total = images.reduce((sum, image) => sum + image.sizeBytes, 0);
    for (const image of images) {
      if (total + bytes <= this.capBytes) return;
      if (await this.removeIfIdle(image.path)) total -= image.sizeBytes;
    }
    if (total + bytes > this.capBytes)
      throw new SandgymError(
        'resource_exhausted',
        `Flattened layer stacks in use fill the node's cap of ${this.capBytes} bytes: end sandboxes on deep stacks, or raise flatStackCapBytes`,
        { retryable: true },
      );
  }

  /** The node's flattened images, least recently used first. */
  private async images(): Promise<{ path: string; sizeBytes: number; usedMs: number }[]> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    const found = await Promise.all(
      names
        .filter((name) => /^[0-9a-f]{64}\.erofs$/.test(name))
        .map(async (name) => {
          const info = await stat(join(this.dir, name)).catch(() => undefined);
          return info && { path: join(this.dir, name), sizeBytes: info.size, usedMs: info.atimeMs };
        }),
    );
    return found.filter((image) => image !== undefined).sort((a, b) => a.usedMs - b.usedMs);
  }

  /**
   * Removes an image unless a mount uses it: a mounted file-backed EROFS image holds the file
   * open, and removing it would keep its blocks until the unmount. The removed image's index
   * stays; a lookup then finds no file and makes it again.
   */
  private async removeIfIdle(path: string): Promise<boolean> {
    if (await this.isMounted(path)) return false;
    await rm(path, { force: true });
    return true;
  }

  private async isMounted(path: string): Promise<boolean> {
    const mounts = await readFile('/proc/self/mountinfo', 'utf8');
    return mounts.split('\n').some((line) => line.includes(' - erofs ') && line.includes(` ${path} `));
  }

  /**
   * Removes every image no mount uses and no create used for `minIdleMs`; the paths it removed.
   * For the node's layer gc: a build's next step stacks the same base, so a fresh image stays.
   */
  async removeIdle(minIdleMs = 15 * 60_000): Promise<string[]> {
    const removed: string[] = [];
    const before = Date.now() - minIdleMs;
    for (const image of await this.images())
      if (image.usedMs < before && (await this.removeIfIdle(image.path))) removed.push(image.path);
    return removed;
  }
}
