import { readFile } from 'node:fs/promises';

/** One line of /proc/self/mountinfo. */
export interface MountEntry {
  mountPoint: string;
  fsType: string;
  source: string;
}

/** Octal escapes (\040 for a space) as the kernel writes them. */
function unescape(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

/** The mounts of this process's mount namespace. */
export async function readMounts(): Promise<MountEntry[]> {
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  const entries: MountEntry[] = [];
  for (const line of text.split('\n')) {
    const [left, right] = line.split(' - ');
    if (!left || !right) continue;
    const mountPoint = left.split(' ')[4];
    const [fsType, source] = right.split(' ');
    if (mountPoint && fsType)
      entries.push({ mountPoint: unescape(mountPoint), fsType, source: unescape(source ?? '') });
  }
  return entries;
}
