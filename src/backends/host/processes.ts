import { readFile } from 'node:fs/promises';

/**
 * A process identity that survives pid reuse: the pid plus its start time in clock ticks since
 * boot (field 22 of /proc/PID/stat).
 */
export interface ProcessIdentity {
  pid: number;
  startTime: number;
}

/** The identity of a live process, or undefined when it is gone. */
export async function processIdentity(pid: number): Promise<ProcessIdentity | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // the command name may hold spaces and parentheses: fields start after the last ')'
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const startTime = Number(fields[19]);
    return Number.isFinite(startTime) ? { pid, startTime } : undefined;
  } catch {
    return undefined;
  }
}

/** True when the process that had this identity is still running. */
export async function isAlive(identity: ProcessIdentity): Promise<boolean> {
  const now = await processIdentity(identity.pid);
  return now?.startTime === identity.startTime;
}

/** Sends a signal, ignoring a process that is already gone. */
export function signalProcess(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ESRCH') throw error;
  }
}
