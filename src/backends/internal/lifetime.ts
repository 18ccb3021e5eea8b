import type { Logger } from '../../common/index.ts';
import type { BackendSandbox, SandboxLifetime } from '../contract.ts';

/** What a sandbox's lifetime counts from. */
export interface LifetimeClock {
  createdAt: number;
  lastActiveAt: number;
  activeCalls: number;
}

/**
 * When a sandbox with `lifetime` must go: its hard deadline, or its idle TTL after the last
 * request ended (never while a request is in flight); undefined when it may live on.
 */
export function expiryOf(lifetime: SandboxLifetime | undefined, clock: LifetimeClock): number | undefined {
  const { idleTtlMs, deadlineMs } = lifetime ?? {};
  const limits = [
    ...(deadlineMs === undefined ? [] : [clock.createdAt + deadlineMs]),
    ...(idleTtlMs === undefined || clock.activeCalls > 0 ? [] : [clock.lastActiveAt + idleTtlMs]),
  ];
  return limits.length ? Math.min(...limits) : undefined;
}

/** Reclaims each of `sandboxes` whose lifetime ran out by `now`; the ids it reclaimed. */
export async function reclaimExpiredOf(
  sandboxes: readonly BackendSandbox[],
  now: number,
  logger: Logger,
): Promise<string[]> {
  const reclaimed: string[] = [];
  for (const sandbox of sandboxes) {
    const due = sandbox.expiresAt();
    if (due === undefined || due > now || sandbox.state === 'stopping' || sandbox.state === 'stopped')
      continue;
    logger.info({ id: sandbox.id, backend: sandbox.backend }, 'lifetime over: reclaiming sandbox');
    try {
      await sandbox.reclaim('timeout');
      reclaimed.push(sandbox.id);
    } catch (error) {
      logger.warn({ id: sandbox.id, err: error }, 'cannot reclaim sandbox');
    }
  }
  return reclaimed;
}
