import { existsSync } from 'node:fs';
import { mkdir, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { LayerImage } from '../contract.ts';
import type { LayerMounts } from './layer-mounts.ts';
import { runProgram } from './run-program.ts';

/** GNU tar flags that keep what overlayfs needs: owners, modes, whiteout devices, opaque xattrs. */
const TAR_FLAGS = ['--numeric-owner', '--xattrs', '--xattrs-include=trusted.*', '-p'];

/** Where the `tar` mode keeps each layer's tar.gz: beside its EROFS image in the store. */
function tarballPath(layer: LayerImage): string {
  return layer.path.replace(/\.erofs$/, '.tar.gz');
}

/**
 * The `tar` loading mode, the classic baseline: every sandbox unpacks a tar.gz of each of its
 * layers into folders of its own and stacks those. The tar.gz is made once from the EROFS image.
 */
export class LayerTarballs {
  constructor(private readonly mounts: LayerMounts) {}

  /** Makes the layer's tar.gz in the store if it is missing. */
  async ensure(layer: LayerImage): Promise<string> {
    const tarball = tarballPath(layer);
    if (existsSync(tarball)) return tarball;
    const [mounted] = await this.mounts.acquire([layer]);
    try {
      const temp = `${tarball}.${process.pid}.tmp`;
      await runProgram('tar', ['-C', mounted ?? '', ...TAR_FLAGS, '-czf', temp, '.'], {
        timeoutMs: 30 * 60_000,
      });
      await rename(temp, tarball);
    } finally {
      this.mounts.release([layer]);
    }
    return tarball;
  }

  /** Unpacks every layer into `<sandboxDir>/lower/<i>`; returns the folders, base first. */
  async unpack(layers: readonly LayerImage[], sandboxDir: string): Promise<string[]> {
    const dirs: string[] = [];
    for (const [index, layer] of layers.entries()) {
      const dir = join(sandboxDir, 'lower', String(index));
      await rm(dir, { recursive: true, force: true });
      await mkdir(dir, { recursive: true });
      await runProgram('tar', ['-C', dir, ...TAR_FLAGS, '-xzf', await this.ensure(layer)], {
        timeoutMs: 30 * 60_000,
      });
      dirs.push(dir);
    }
    return dirs;
  }
}
