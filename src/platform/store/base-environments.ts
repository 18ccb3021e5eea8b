import { buildBusyboxRootfs, buildDebianRootfs } from '../../backends/index.ts';
import type { Logger } from '../../common/index.ts';
import type { LayerStore } from './layer-store.ts';

/** A base environment that `sandgym setup` builds once and caches in the store. */
interface BaseEnvironment {
  ref: string;
  description: string;
  build(dir: string): Promise<void>;
  createdFrom: string;
}

/** python3-pytest: SWE-bench rows name their tests as pytest node ids. */
const DEBIAN_PACKAGES = ['python3', 'python3-pytest', 'git', 'ca-certificates'];

function baseEnvironments(): BaseEnvironment[] {
  const mirror = process.env['SANDGYM_DEBIAN_MIRROR'] ?? 'http://deb.debian.org/debian';
  return [
    {
      ref: 'busybox:latest',
      description: 'Debian busybox-static and its applets: a tiny root for fast tests (file times kept)',
      build: buildBusyboxRootfs,
      createdFrom: 'busybox-static',
    },
    {
      ref: 'debian:bookworm',
      // the recipe's description: an image built by an older recipe (file times reset) is rebuilt
      description: `Debian 12 minbase with ${DEBIAN_PACKAGES.join(', ')} (file times kept)`,
      build: (dir) => buildDebianRootfs(dir, { suite: 'bookworm', mirror, packages: DEBIAN_PACKAGES }),
      createdFrom: `debootstrap --variant=minbase bookworm ${mirror}`,
    },
  ];
}

/**
 * The base environment that stands in for a Docker Hub tag of the same release: `debian:12`,
 * `debian:bookworm-slim`, `debian:12.8-slim`, `debian:bookworm-20240513-slim` are Debian 12 as the store's `debian:bookworm` is
 * (which has a few packages more). Any other tag has none.
 */
export function standInFor(familiar: string): string | undefined {
  return /^debian:(bookworm|12(\.\d+)?)(-\d{8})?(-slim)?(-\d{8})?$/.test(familiar)
    ? 'debian:bookworm'
    : undefined;
}

/** The environment `sandgym run` uses when none is named. */
export const DEFAULT_ENVIRONMENT = 'debian:bookworm';

/**
 * Builds every base environment the store lacks, or holds from an older recipe (its description
 * names the recipe). Idempotent: a present, current one is skipped.
 */
export async function ensureBaseEnvironments(store: LayerStore, logger: Logger): Promise<string[]> {
  const built: string[] = [];
  for (const base of baseEnvironments()) {
    if (
      store.hasEnvironment(base.ref) &&
      (await store.getEnvironment(base.ref)).description === base.description
    ) {
      continue;
    }
    logger.info({ environment: base.ref }, 'building base environment');
    const dir = await store.scratch('rootfs');
    try {
      await base.build(dir);
      const layer = await store.addLayerFromDirectory(dir, base.createdFrom);
      const [name = '', version = ''] = base.ref.split(':');
      await store.putEnvironment({
        name,
        version,
        layers: [layer.digest],
        config: { env: {}, workdir: '/', user: 'root' },
        description: base.description,
      });
      built.push(base.ref);
    } finally {
      await store.removeScratch(dir);
    }
  }
  return built;
}
