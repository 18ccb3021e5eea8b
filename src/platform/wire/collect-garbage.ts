import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** How long after the last large call ends the collection waits, so a burst's calls share one. */
const SETTLE_MS = 200;

let collect: (() => void) | undefined;
let scheduled: NodeJS.Timeout | undefined;

/**
 * Runs a full garbage collection shortly (once for calls that end together). Large request bodies
 * live as long as their calls, long enough to reach V8's old space, and nothing collects that
 * space in a server that goes idle after a burst: without this, a node that took a burst of
 * 64 MiB writes keeps gigabytes it no longer uses until its next busy moment. V8 exposes its
 * collector only behind a flag, which can be set at run time (as test runners do for leak checks).
 */
export function collectGarbageSoon(): void {
  if (scheduled) return;
  scheduled = setTimeout(() => {
    scheduled = undefined;
    if (!collect) {
      setFlagsFromString('--expose-gc');
      collect = runInNewContext('gc') as () => void;
    }
    collect();
  }, SETTLE_MS);
  scheduled.unref();
}
