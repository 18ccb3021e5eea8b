import { resolve } from 'node:path';
import type { LayerManifest, ProjectStore } from '../store/layer-store.ts';
import { withRootedTree } from './rooted-tree.ts';
import { extractTar, normaliseFolderTimes, openTar, storeBudget } from './tar-extract.ts';

/**
 * A layer from a tar (plain or gzip). Whiteouts in it become overlay whiteouts, so the layer
 * hides files of the layers under it, as an image layer does.
 */
export async function buildLayerFromTar(store: ProjectStore, archive: string): Promise<LayerManifest> {
  const path = resolve(archive);
  const dir = await store.scratch('tar');
  try {
    await withRootedTree(dir, path, async (tree) => {
      await extractTar(await openTar(path), path, tree, 'layer', await storeBudget(store));
      await normaliseFolderTimes(tree);
    });
    return await store.addLayerFromDirectory(dir, `tar ${path}`);
  } finally {
    await store.removeScratch(dir);
  }
}
