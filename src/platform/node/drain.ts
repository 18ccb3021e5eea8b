import type { Logger } from '../../common/index.ts';
import type { BackendSandbox } from '../../backends/index.ts';
import type { DrainProgress } from '../wire/index.ts';

/** How often a drain reports. */
const REPORT_EVERY_MS = 1_000;

/**
 * What a draining node waits for, reported every second until none of its sandboxes is running
 * or paused (each ended or hibernated). With `hibernateIdle`, idle sandboxes are hibernated at
 * once; busy ones are left to finish their request and are hibernated on a later round.
 */
export async function* drainProgress(
  live: () => BackendSandbox[],
  options: { hibernateIdle: boolean; signal: AbortSignal; logger: Logger },
): AsyncGenerator<DrainProgress> {
  for (;;) {
    const sandboxes = live();
    if (options.hibernateIdle) {
      for (const sandbox of sandboxes) {
        if (sandbox.state !== 'running' && sandbox.state !== 'paused') continue;
        if (sandbox.activeCalls > 0) continue;
        await sandbox.hibernate({ signal: options.signal }).catch((error: unknown) => {
          options.logger.debug({ sandbox: sandbox.id, err: error }, 'drain could not hibernate a sandbox');
        });
      }
    }
    const waiting = sandboxes.filter(
      (sandbox) => sandbox.state !== 'hibernated' && sandbox.state !== 'stopped',
    );
    yield {
      remaining: waiting.length,
      hibernated: sandboxes.filter((sandbox) => sandbox.state === 'hibernated').length,
      waitingFor: waiting.slice(0, 20).map((sandbox) => sandbox.id),
    };
    if (waiting.length === 0 || options.signal.aborted) return;
    await new Promise((resolve) => setTimeout(resolve, REPORT_EVERY_MS));
  }
}
