import { createHash } from 'node:crypto';
import { createReadStream, existsSync } from 'node:fs';
import { mkdir, open, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { SandgymError } from '../../common/index.ts';
import type { LayerImage } from '../contract.ts';
import { SingleFlight } from '../internal/single-flight.ts';

/**
 * The `eager` loading mode's node-local copies: a whole layer is copied off the store before
 * its first mount (the "pull" baseline), its digest checked on the way, then fsynced.
 */
export class LayerCopies {
  private readonly copying = new SingleFlight<LayerImage>();

  constructor(private readonly dir: string) {}

  /** The layer as a node-local file, copied now if it is not here yet. */
  local(layer: LayerImage): Promise<LayerImage> {
    return this.copying.run(layer.digest, () => this.copy(layer));
  }

  private async copy(layer: LayerImage): Promise<LayerImage> {
    const path = join(this.dir, `${layer.digest.slice('sha256:'.length)}.erofs`);
    if (existsSync(path)) return { digest: layer.digest, path };
    await mkdir(this.dir, { recursive: true });
    const temp = `${path}.${process.pid}.tmp`;
    const hash = createHash('sha256');
    const out = await open(temp, 'w');
    try {
      for await (const chunk of createReadStream(layer.path, { highWaterMark: 1 << 20 })) {
        hash.update(chunk as Buffer);
        await out.write(chunk as Buffer);
      }
      await out.sync();
    } catch (error) {
      await rm(temp, { force: true });
      throw new SandgymError('platform_error', `Cannot copy layer ${layer.digest} from ${layer.path}`, {
        cause: error,
      });
    } finally {
      await out.close();
    }
    const actual = `sha256:${hash.digest('hex')}`;
    if (actual !== layer.digest) {
      await rm(temp, { force: true });
      throw new SandgymError(
        'failed_precondition',
        `Layer file ${layer.path} is corrupt or truncated: its sha256 is ${actual}, not ${layer.digest}; rebuild or re-copy the layer`,
      );
    }
    await rename(temp, path);
    return { digest: layer.digest, path };
  }
}
