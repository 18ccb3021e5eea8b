import { connect, type Socket } from 'node:net';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { SandgymError } from '../../common/index.ts';

interface Waiter {
  resolve(value: unknown): void;
  reject(error: Error): void;
  command: string;
}

/**
 * A client of QEMU's machine protocol (QMP) on a unix socket: JSON lines, one command at a
 * time in order, answers matched in order; asynchronous events are skipped.
 */
export class Qmp {
  private readonly waiting: Waiter[] = [];
  private closed = false;

  private constructor(private readonly socket: Socket) {
    const lines = createInterface({ input: socket });
    lines.on('line', (line) => this.onLine(line));
    lines.on('error', () => undefined); // the socket's 'close' reports it
    socket.on('error', () => undefined); // 'close' follows and fails what waits
    socket.on('close', () => {
      this.closed = true;
      for (const waiter of this.waiting.splice(0)) {
        waiter.reject(new SandgymError('agent_crash', `QEMU went away during ${waiter.command}`));
      }
    });
  }

  /** Connects (waiting up to `timeoutMs` for QEMU to open the socket) and leaves negotiation mode. */
  static async connect(path: string, timeoutMs: number): Promise<Qmp> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const socket = await new Promise<Socket>((resolve, reject) => {
          const s = connect(path, () => resolve(s));
          s.once('error', reject);
        });
        const qmp = new Qmp(socket);
        await qmp.greeting();
        await qmp.execute('qmp_capabilities');
        return qmp;
      } catch (error) {
        if (Date.now() > deadline) {
          throw new SandgymError('platform_error', `Cannot reach QEMU's control socket ${path}`, {
            cause: error,
          });
        }
        await sleep(20);
      }
    }
  }

  private greeted: ((value: unknown) => void) | undefined;

  private greeting(): Promise<unknown> {
    return new Promise((resolve) => (this.greeted = resolve));
  }

  private onLine(line: string): void {
    let message: { QMP?: unknown; event?: string; return?: unknown; error?: { desc?: string } };
    try {
      message = JSON.parse(line) as typeof message;
    } catch {
      return;
    }
    if (message.QMP !== undefined) return this.greeted?.(message.QMP);
    if (message.event !== undefined) return;
    const waiter = this.waiting.shift();
    if (!waiter) return;
    if (message.error)
      waiter.reject(
        new SandgymError('platform_error', `QEMU refused ${waiter.command}: ${message.error.desc ?? line}`),
      );
    else waiter.resolve(message.return);
  }

  execute(command: string, args?: Record<string, unknown>): Promise<unknown> {
    if (this.closed)
      return Promise.reject(new SandgymError('agent_crash', `QEMU is gone; cannot ${command}`));
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject, command });
      this.socket.write(
        `${JSON.stringify(args ? { execute: command, arguments: args } : { execute: command })}\n`,
      );
    });
  }

  close(): void {
    this.socket.destroy();
  }
}
