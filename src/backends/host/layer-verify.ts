import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { SandgymError, writeFileAtomic } from '../../common/index.ts';
import type { LayerImage, LayerVerification } from '../contract.ts';

/** The sha256 of a file, as "sha256:<hex>". */
export async function sha256OfFile(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return `sha256:${hash.digest('hex')}`;
}

const verifiedSchema = z.record(
  z.string(),
  z.object({ size: z.number(), mtimeMs: z.number(), ino: z.number() }),
);

/**
 * Checks each layer file against its digest before the node mounts it, so a corrupt or
 * truncated file never becomes a sandbox's root. A file already verified on this node and
 * unchanged since (same inode, size and mtime) is not read again.
 */
export class LayerVerifier {
  private readonly cachePath: string;

  constructor(nodeDir: string) {
    this.cachePath = join(nodeDir, 'verified-layers.json');
  }

  private async load(): Promise<z.infer<typeof verifiedSchema>> {
    try {
      const parsed = verifiedSchema.safeParse(JSON.parse(await readFile(this.cachePath, 'utf8')));
      return parsed.success ? parsed.data : {};
    } catch {
      return {};
    }
  }

  async verify(layer: LayerImage, depth: LayerVerification): Promise<void> {
    const info = await stat(layer.path).catch((error: unknown) => {
      throw new SandgymError('not_found', `Layer ${layer.digest} is missing from the store (${layer.path})`, {
        cause: error,
      });
    });
    if (layer.sizeBytes !== undefined && info.size !== layer.sizeBytes) {
      throw new SandgymError(
        'failed_precondition',
        `Layer file ${layer.path} is corrupt or truncated: it has ${info.size} bytes, its manifest says ${layer.sizeBytes}; rebuild or re-copy the layer`,
      );
    }
    if (depth === 'size') return;
    const known = (await this.load())[layer.digest];
    if (known && known.size === info.size && known.mtimeMs === info.mtimeMs && known.ino === info.ino) return;
    const actual = await sha256OfFile(layer.path);
    if (actual !== layer.digest) {
      throw new SandgymError(
        'failed_precondition',
        `Layer file ${layer.path} is corrupt or truncated: its sha256 is ${actual}, not ${layer.digest}; rebuild or re-copy the layer`,
      );
    }
    const cache = await this.load();
    cache[layer.digest] = { size: info.size, mtimeMs: info.mtimeMs, ino: info.ino };
    await writeFileAtomic(this.cachePath, JSON.stringify(cache));
  }
}
