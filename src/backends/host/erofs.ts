import { runProgram } from './run-program.ts';

/** What to leave out of an image: paths relative to the source folder, or regexes over them. */
export interface ErofsBuildOptions {
  excludePaths?: string[];
  excludeRegexes?: string[];
}

/**
 * Builds an EROFS image of a folder. Timestamps and the UUID are fixed, so the same tree always
 * gives the same bytes and so the same content address. lz4hc keeps images small and is cheap
 * to decompress on the read path.
 */
export async function buildErofsImage(
  sourceDir: string,
  imagePath: string,
  options: ErofsBuildOptions = {},
): Promise<void> {
  const excludes = [
    ...(options.excludePaths ?? []).map((path) => `--exclude-path=${path}`),
    ...(options.excludeRegexes ?? []).map((regex) => `--exclude-regex=${regex}`),
  ];
  await runProgram(
    'mkfs.erofs',
    ['-zlz4hc', '-T0', '-U', '00000000-0000-0000-0000-000000000000', ...excludes, imagePath, sourceDir],
    {
      timeoutMs: 30 * 60_000,
    },
  );
}
