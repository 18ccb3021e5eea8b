import { agentBinaryPath } from './paths.ts';
import { runProgram } from './run-program.ts';

/**
 * Mounts an overlay of `lowers` (base first) at `target`: read-only without `writable`. The
 * agent binary mounts it (agent/overlay.c), one lower dir per fsconfig call where the kernel has
 * "lowerdir+": the `mount` program's single option string must fit a page, which a stack of
 * ~40 layers does not.
 */
export async function mountOverlay(
  target: string,
  lowers: readonly string[],
  writable?: { upper: string; work: string },
): Promise<void> {
  // the agent takes them top first, as overlayfs lists them
  const topFirst = [...lowers].reverse().join(':');
  await runProgram(agentBinaryPath(), [
    'mount-overlay',
    target,
    topFirst,
    ...(writable ? [writable.upper, writable.work] : []),
  ]);
}
