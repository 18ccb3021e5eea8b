import { readFileSync } from 'node:fs';

/** MemAvailable of the host, in MiB: what it can still give without swapping. */
export function hostAvailableMib(): number {
  const line = readFileSync('/proc/meminfo', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('MemAvailable:'));
  return Math.floor(Number(line?.split(/\s+/)[1] ?? 0) / 1024);
}
