import { readdirSync, readlinkSync } from 'node:fs';

/**
 * Open file handles of process `pid` on paths under `prefix`: what a closed platform must not
 * hold (trajectory logs, pin files, channels).
 */
export function openHandlesUnder(prefix: string, pid: number | 'self' = 'self'): string[] {
  const held: string[] = [];
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      if (target === prefix || target.startsWith(`${prefix}/`)) held.push(target);
    } catch {
      // closed while we looked
    }
  }
  return held;
}
