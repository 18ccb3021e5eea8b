import { runProgram } from './run-program.ts';

/**
 * The image's build time: fixed, so one tree always packs to the same bytes and so the same
 * content address, and far in the future, because mkfs.erofs clamps file times to it (a
 * SOURCE_DATE_EPOCH) rather than replacing them, as `-T` would.
 */
const BUILD_TIME = String(Date.UTC(2100, 0, 1) / 1000);

/**
 * Builds an EROFS image of a folder. Every file keeps its modification time: Python checks a
 * cached .pyc against its source's, and a layer that reset them would make every interpreter
 * rewrite its standard library's caches (writes into /usr/lib that look like tampering). The
 * build time and the UUID are fixed, so the same tree gives the same bytes. lz4hc keeps images
 * small and is cheap to decompress on the read path; `fast` takes lz4, for images made on a
 * create's path (a deep stack's flattened base), where lz4hc's time would be the create's.
 */
export async function buildErofsImage(
  sourceDir: string,
  imagePath: string,
  options: { fast?: boolean } = {},
): Promise<void> {
  await runProgram(
    'mkfs.erofs',
    [options.fast ? '-zlz4' : '-zlz4hc', '-U', '00000000-0000-0000-0000-000000000000', imagePath, sourceDir],
    { timeoutMs: 30 * 60_000, env: { SOURCE_DATE_EPOCH: BUILD_TIME } },
  );
}
