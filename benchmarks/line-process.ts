import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface, type Interface } from 'node:readline';

/**
 * A child process that speaks JSON lines: it prints one when it is ready, then (for those that
 * take commands on stdin) one answer per command line, in order.
 */
export class LineProcess {
  private readonly waiting: ((line: string) => void)[] = [];
  private readonly lines: Interface;
  private exited = false;

  private constructor(
    private readonly child: ChildProcess,
    readonly ready: unknown,
  ) {
    this.lines = createInterface({ input: child.stdout! });
    this.lines.on('line', (line) => this.waiting.shift()?.(line));
    child.once('exit', () => (this.exited = true));
  }

  /** Starts `program args` and waits for its first line, failing if it exits first. */
  static async start(program: string, args: string[], env: NodeJS.ProcessEnv): Promise<LineProcess> {
    const child = spawn(program, args, { env, stdio: ['pipe', 'pipe', 'inherit'] });
    const first = await new Promise<string>((resolve, reject) => {
      const lines = createInterface({ input: child.stdout });
      lines.once('line', (line) => {
        lines.close();
        resolve(line);
      });
      child.once('exit', (code, signal) =>
        reject(new Error(`${program} exited (${code ?? signal}) before it was ready`)),
      );
    });
    return new LineProcess(child, JSON.parse(first) as unknown);
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** Sends one command line and waits for its answer line. */
  request(command: unknown): Promise<unknown> {
    return new Promise((resolve, reject) => {
      if (this.exited) return reject(new Error('the process has exited'));
      this.waiting.push((line) => resolve(JSON.parse(line) as unknown));
      this.child.stdin!.write(`${JSON.stringify(command)}\n`);
    });
  }

  /** CPU seconds it has used so far (user and system), from /proc. */
  cpuSeconds(): number {
    const fields = readFileSync(`/proc/${this.pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the command's name
    return (Number(fields[11]) + Number(fields[12])) / 100;
  }

  /** Its resident memory now, in MiB. */
  rssMib(): number {
    const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${this.pid}/status`, 'utf8'));
    return Math.round(Number(match?.[1] ?? 0) / 1024);
  }

  /** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
  async stop(graceMs = 5_000): Promise<void> {
    this.lines.close();
    if (this.exited) return;
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
  }
}
