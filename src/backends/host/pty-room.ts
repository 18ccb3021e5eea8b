import { readFile, writeFile } from 'node:fs/promises';

/** The kernel's ceiling on pseudo-terminals across every devpts instance (NR_UNIX98_PTY_MAX). */
const KERNEL_PTY_CEILING = 1 << 20;

/**
 * Raises the host's pty limit to the kernel's ceiling. Each sandbox has a devpts instance of its
 * own with a cap (SANDBOX_MAX_PTYS), but every instance also draws from this one node-wide pool
 * (4096 by default): without the raise, one sandbox at its cap times a dozen would leave its
 * neighbours none. Best effort: a host that refuses keeps its limit.
 */
export async function raisePtyLimit(): Promise<void> {
  const path = '/proc/sys/kernel/pty/max';
  const current = Number((await readFile(path, 'utf8').catch(() => '0')).trim());
  if (current >= KERNEL_PTY_CEILING) return;
  await writeFile(path, String(KERNEL_PTY_CEILING)).catch(() => undefined);
}
