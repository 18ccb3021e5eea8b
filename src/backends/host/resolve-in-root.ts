import { lstat, readlink } from 'node:fs/promises';
import { join } from 'node:path';

/** How many links one resolution follows before it counts as a loop, as the kernel's limit. */
const MAX_LINKS = 40;

function components(path: string): string[] {
  return path.split('/').filter((part) => part !== '' && part !== '.');
}

/**
 * Where `path` (absolute, as a sandbox sees it) leads inside the tree at `root`, resolved the way
 * the kernel resolves it in a sandbox whose root that tree is: symlinks followed with the tree as
 * `/`, `..` stopping at the root. From the first component that does not exist, the rest is taken
 * as written (what `realpath -m` does). Only folders already resolved are ever joined to `root`
 * and only `lstat` and `readlink` look at them, so no symlink of the tree is followed on the host.
 * Undefined when the links loop.
 */
export async function resolveInRoot(root: string, path: string): Promise<string | undefined> {
  const resolved: string[] = [];
  let pending = components(path);
  let links = 0;
  while (pending.length > 0) {
    const [part = '', ...rest] = pending;
    pending = rest;
    if (part === '..') {
      resolved.pop();
      continue;
    }
    const here = join(root, ...resolved, part);
    const info = await lstat(here).catch(() => undefined);
    if (info?.isSymbolicLink()) {
      if (++links > MAX_LINKS) return undefined;
      const bytes = await readlink(here, { encoding: 'buffer' });
      const target = bytes.toString('utf8');
      // a target no text names exactly is not followed as text: count it as leading anywhere
      if (!Buffer.from(target, 'utf8').equals(bytes)) return undefined;
      if (target.startsWith('/')) resolved.length = 0;
      pending = [...components(target), ...pending];
      continue;
    }
    resolved.push(part);
    if (!info || !info.isDirectory()) {
      // nothing below a missing entry or a file exists: the rest is lexical
      for (const next of pending) {
        if (next === '..') resolved.pop();
        else resolved.push(next);
      }
      break;
    }
  }
  return `/${resolved.join('/')}`;
}
