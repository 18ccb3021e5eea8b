import { runProgram } from './run-program.ts';

/**
 * Builds an EROFS image of a folder. Timestamps and the UUID are fixed, so the same tree always
 * gives the same bytes and so the same content address. lz4hc keeps images small and is cheap
 * to decompress on the read path.
 */
export async function buildErofsImage(sourceDir: string, imagePath: string): Promise<void> {
  await runProgram(
    'mkfs.erofs',
    ['-zlz4hc', '-T0', '-U', '00000000-0000-0000-0000-000000000000', imagePath, sourceDir],
    {
      timeoutMs: 30 * 60_000,
    },
  );
}
