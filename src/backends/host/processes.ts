import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { SandgymError } from '../../common/index.ts';

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

/**
 * Starts `node script ...args` in a session of its own (no signal of this terminal reaches it,
 * and it outlives this process) and resolves with the first line it writes on stdout; after
 * that line nothing of it is read. Rejects if it exits first, or sends it SIGTERM and rejects
 * after `timeoutMs`.
 */
export function startDetachedNode(script: string, args: string[], timeoutMs: number): Promise<string> {
  const child = spawn(process.execPath, [script, ...args], {
    detached: true,
    cwd: '/',
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  child.unref();
  let text = '';
  const answered = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGTERM');
      reject(new SandgymError('timeout', `${script} did not answer in ${timeoutMs} ms`));
    }, timeoutMs);
    timer.unref();
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk: string) => {
      text += chunk;
      const end = text.indexOf('\n');
      if (end < 0) return;
      clearTimeout(timer);
      resolve(text.slice(0, end));
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new SandgymError('platform_error', `${script} exited (${code ?? signal}) before it answered`));
    });
    child.once('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
  });
  return answered.finally(() => child.stdout.destroy());
}
