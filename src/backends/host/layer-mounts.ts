import { randomBytes } from 'node:crypto';
import { mkdir, readdir, rm, rmdir, statfs, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { SandgymError } from '../../common/index.ts';
import type { LayerImage, LayerVerification } from '../contract.ts';
import { SingleFlight } from '../internal/single-flight.ts';
import { FlatStacks } from './flat-stacks.ts';
import { LayerCopies } from './layer-copies.ts';
import { LayerVerifier } from './layer-verify.ts';
import { mountOverlay } from './overlay-mount.ts';
import { isAlive, type ProcessIdentity } from './processes.ts';
import { runProgram } from './run-program.ts';

const EROFS_MAGIC = 0xe0f5e1e2;

async function isErofsMount(path: string): Promise<boolean> {
  try {
    return (await statfs(path)).type === EROFS_MAGIC;
  } catch {
    return false;
  }
}

/**
 * The node's layer mounts: each EROFS image is mounted once, read-only, straight from the store
 * file, and every sandbox on the node stacks the same mount. Read-only data is in the page cache
 * once. Unmounting is left to {@link LayerMounts.unmountIdle}. The kernel refuses to unmount a
 * layer that a live overlay uses, but a layer mounted for a create whose overlay is not made yet
 * is idle to it: so a process counts a layer as used before it mounts it, and marks it held (a
 * file per process under `.held/`) for other processes on the node, whose gc then leaves it.
 * The mark stays while the layer is mounted, used or not, until this process's own gc unmounts
 * it: a create then writes no file for a layer it mounted before.
 */
export class LayerMounts {
  private readonly mounting = new SingleFlight<string>();
  private readonly users = new Map<string, number>();
  /** Layers this process found or made mounted; its own gc alone unmounts them while its mark is on them. */
  private readonly mounted = new Set<string>();
  /** Layers this process has its mark on (or is writing it for). */
  private readonly marked = new Map<string, Promise<void>>();

  private readonly verifier: LayerVerifier;
  private readonly copies: LayerCopies | undefined;
  private readonly flat: FlatStacks;
  /** The stacks this process mounted flattened, by {@link FlatStacks.keyOf}: what a release drops. */
  private readonly flattened = new Map<string, { physical: LayerImage[]; users: number }>();

  constructor(
    private readonly mountsDir: string,
    private readonly helperPath: string,
    private readonly loading: { mode: 'ondemand' | 'eager'; verify: LayerVerification; copiesDir: string },
    /** This process, whose marks on held layers other processes check. */
    private readonly self: ProcessIdentity,
    /** Where flattened images live, the deepest stack mounted as it is, and the images' byte cap. */
    private readonly flattening: { dir: string; maxDepth: number; capBytes?: number },
  ) {
    this.verifier = new LayerVerifier(mountsDir);
    this.flat = new FlatStacks(
      flattening.dir,
      (layers, consume) => this.viewOf(layers, consume),
      flattening.capBytes,
    );
    this.copies = loading.mode === 'eager' ? new LayerCopies(loading.copiesDir) : undefined;
  }

  /**
   * Mount points for the layers, base first; mounts what is not mounted yet. A stack deeper than
   * `maxDepth` gets fewer points: its base flattened into one image (see FlatStacks).
   */
  async acquire(layers: readonly LayerImage[]): Promise<string[]> {
    if (layers.length <= this.flattening.maxDepth) return this.acquireExact(layers);
    const key = FlatStacks.keyOf(layers);
    const physical = await this.flat.physical(layers, this.flattening.maxDepth);
    const points = await this.acquireExact(physical);
    const known = this.flattened.get(key);
    this.flattened.set(key, { physical, users: (known?.users ?? 0) + 1 });
    return points;
  }

  /** Drops this process's use of the layers (its mark stays until {@link unmountIdle}). */
  release(layers: readonly LayerImage[]): void {
    if (layers.length <= this.flattening.maxDepth) return this.releaseExact(layers);
    const key = FlatStacks.keyOf(layers);
    const known = this.flattened.get(key);
    if (!known) return;
    if (known.users > 1) this.flattened.set(key, { ...known, users: known.users - 1 });
    else this.flattened.delete(key);
    this.releaseExact(known.physical);
  }

  /**
   * A deep stack's base flattened into one image, made or found on the node: at most
   * `maxDepth` layers, for a backend that takes fewer than the containers' limit (a microvm's
   * disks). The caller mounts the images itself.
   */
  flattenStack(layers: readonly LayerImage[], maxDepth: number): Promise<LayerImage[]> {
    return this.flat.physical(layers, maxDepth);
  }

  /** Removes flattened images nothing mounts and no create used lately; their paths. */
  removeIdleFlatImages(): Promise<string[]> {
    return this.flat.removeIdle();
  }

  /** A read-only overlay of a shallow stack, for making a flattened image of it. */
  private async viewOf<T>(layers: readonly LayerImage[], consume: (root: string) => Promise<T>): Promise<T> {
    const points = await this.acquireExact(layers);
    try {
      const view = join(this.flattening.dir, `.view-${this.self.pid}-${randomBytes(6).toString('hex')}`);
      await mkdir(view, { recursive: true });
      try {
        await mountOverlay(view, points);
        try {
          return await consume(view);
        } finally {
          await runProgram('umount', [view]).catch(() => undefined);
        }
      } finally {
        await rmdir(view).catch(() => undefined);
      }
    } finally {
      this.releaseExact(layers);
    }
  }

  private async acquireExact(layers: readonly LayerImage[]): Promise<string[]> {
    // counted (and marked held) first: no gc may unmount them between the mount and its use
    for (const layer of layers) this.users.set(layer.digest, (this.users.get(layer.digest) ?? 0) + 1);
    try {
      await Promise.all(layers.map((layer) => this.mark(layer.digest)));
      return await Promise.all(layers.map((layer) => this.mountOnce(layer)));
    } catch (error) {
      this.releaseExact(layers);
      throw error;
    }
  }

  private releaseExact(layers: readonly LayerImage[]): void {
    for (const layer of layers) {
      const left = (this.users.get(layer.digest) ?? 1) - 1;
      if (left > 0) this.users.set(layer.digest, left);
      else this.users.delete(layer.digest);
    }
  }

  /** This process's mark on a layer it uses, which other processes' gc respects while it lives. */
  private heldMarker(digest: string): string {
    return join(
      this.mountsDir,
      '.held',
      digest.replace(/^sha256:/, ''),
      `${this.self.pid}-${this.self.startTime}`,
    );
  }

  private mark(digest: string): Promise<void> {
    let marking = this.marked.get(digest);
    if (!marking) {
      marking = this.markHeld(digest);
      this.marked.set(digest, marking);
      marking.catch(() => this.marked.delete(digest));
    }
    return marking;
  }

  private async markHeld(digest: string): Promise<void> {
    const marker = this.heldMarker(digest);
    await mkdir(dirname(marker), { recursive: true });
    await writeFile(marker, '');
  }

  /** Whether a live process other than this one holds the layer (hex digest). */
  private async heldElsewhere(hex: string): Promise<boolean> {
    const dir = join(this.mountsDir, '.held', hex);
    for (const name of await readdir(dir).catch(() => [] as string[])) {
      const [pid, startTime] = name.split('-').map(Number);
      if (pid === this.self.pid && startTime === this.self.startTime) continue;
      if (pid && startTime !== undefined && (await isAlive({ pid, startTime }))) return true;
      await rm(join(dir, name), { force: true }); // a dead process's mark
    }
    return false;
  }

  private mountOnce(layer: LayerImage): Promise<string> {
    return this.mounting.run(layer.digest, () => this.mount(layer));
  }

  private async mount(layer: LayerImage): Promise<string> {
    const point = join(this.mountsDir, layer.digest.replace(/^sha256:/, ''));
    if (this.mounted.has(layer.digest)) return point;
    if (await isErofsMount(point)) {
      this.mounted.add(layer.digest);
      return point;
    }
    const source = this.copies ? await this.copies.local(layer) : layer;
    if (!this.copies) await this.verifier.verify(layer, this.loading.verify);
    await mkdir(point, { recursive: true });
    try {
      await runProgram(this.helperPath, ['mount-erofs', source.path, point], { timeoutMs: 30_000 });
    } catch (error) {
      throw new SandgymError('platform_error', `Cannot mount layer ${layer.digest} from ${layer.path}`, {
        cause: error,
      });
    }
    this.mounted.add(layer.digest);
    return point;
  }

  /** Deletes node-local copies (eager mode) whose layer is not mounted; returns their paths. */
  async removeIdleCopies(): Promise<string[]> {
    const removed: string[] = [];
    for (const name of await readdir(this.loading.copiesDir).catch(() => [] as string[])) {
      const hex = name.replace(/\.erofs$/, '');
      if (!/^[0-9a-f]{64}$/.test(hex) || (await isErofsMount(join(this.mountsDir, hex)))) continue;
      await rm(join(this.loading.copiesDir, name), { force: true });
      removed.push(join(this.loading.copiesDir, name));
    }
    return removed;
  }

  /** Unmounts every layer no sandbox uses; returns the mount points it removed. */
  async unmountIdle(): Promise<string[]> {
    let names: string[];
    try {
      names = await readdir(this.mountsDir);
    } catch {
      return [];
    }
    const removed: string[] = [];
    for (const name of names) {
      const digest = `sha256:${name}`;
      if (!/^[0-9a-f]{64}$/.test(name) || this.users.has(digest)) continue;
      this.mounted.delete(digest);
      if (this.marked.delete(digest)) await rm(this.heldMarker(digest), { force: true });
      if (await this.heldElsewhere(name)) continue;
      const point = join(this.mountsDir, name);
      let busy = false;
      // a create of this process may have taken it up meanwhile (and marked it again)
      while (!busy && !this.users.has(digest) && (await isErofsMount(point))) {
        try {
          await runProgram('umount', [point], { timeoutMs: 30_000 });
          removed.push(point);
        } catch {
          busy = true; // a live sandbox, perhaps of another process, still stacks it
        }
      }
      if (!busy) await rmdir(point).catch(() => undefined);
    }
    return removed;
  }
}
