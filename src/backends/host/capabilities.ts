import { readFile } from 'node:fs/promises';

/** CAP_SYS_RESOURCE's number in linux/capability.h. */
const CAP_SYS_RESOURCE = 24;

/**
 * Whether this process may hand CAP_SYS_RESOURCE to a sandbox's agent: its bounding set has it.
 * Hosts that are themselves sandboxed may lack it, and asking the runtime for a capability the
 * host does not have fails every start.
 */
export async function hostCanGrantSysResource(): Promise<boolean> {
  const status = await readFile('/proc/self/status', 'utf8').catch(() => '');
  const bounding = /^CapBnd:\s*([0-9a-f]+)$/m.exec(status)?.[1];
  return bounding !== undefined && ((BigInt(`0x${bounding}`) >> BigInt(CAP_SYS_RESOURCE)) & 1n) === 1n;
}
