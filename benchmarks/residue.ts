import { readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { hostProgram, runProgram } from '../src/backends/index.ts';
import { Platform, defaultDataDir, defaultStoreDir } from '../src/platform/index.ts';

/** A benchmark's data folder: `bench-[kind-]PID[-name]` (see fixture.ts and each benchmark). */
const BENCH_FOLDER = /^bench-(?:[a-z-]+-)?(\d+)(?:-[a-z-]+)?$/;

function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Removes what benchmark runs killed midway left in the data folder (their sandboxes, cgroups,
 * mounts and baseline containers), so that a run is not measured against the one before it.
 * A folder whose process still runs, or whose pid a new process took, is left alone.
 */
export async function reapDeadBenchRuns(progress: (message: string) => void): Promise<void> {
  const base = defaultDataDir();
  for (const name of await readdir(base).catch(() => [] as string[])) {
    const pid = BENCH_FOLDER.exec(name)?.[1];
    if (pid === undefined || isRunning(Number(pid))) continue;
    progress(`removing what a killed run left in ${name}`);
    const dir = join(base, name);
    const crun = `${hostProgram('crun')} --root ${join(dir, 'baseline-runtime')}`;
    await runProgram('bash', ['-c', `${crun} list -q | xargs -r -I{} ${crun} delete --force {}`]);
    const platform = await Platform.local({ dataDir: dir, storeDir: defaultStoreDir(base) });
    try {
      await platform.gc();
    } finally {
      await platform.close();
    }
    await rm(dir, { recursive: true, force: true });
  }
}
