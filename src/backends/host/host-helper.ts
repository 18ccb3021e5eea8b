import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { SandgymError } from '../../common/index.ts';

/** What a sandbox's new root is made of. */
export type NewRoot =
  | {
      kind: 'overlay';
      lowers: string[];
      upper: string;
      work: string;
      lowersAreErofs: boolean;
      /**
       * `fresh`: a new /dev, and every IPC object removed (between two tenants); `keep`: /dev and
       * IPC as they are (a shell scrubbed already, on its way to its next tenant).
       */
      dev: 'fresh' | 'keep';
    }
  | { kind: 'bind'; dir: string };

interface Pending {
  resolve(value: string): void;
  reject(error: Error): void;
  what: string;
}

/** What the helper needs to start a container (see `launch` in agent/helper.c). */
export interface LaunchRequest {
  /** The bundle folder: config.json, the channel FIFOs, runtime.log; upper, work, rootfs with `lowers`. */
  dir: string;
  /** cgroup.procs files to join before the runtime starts (the hybrid freeze leaf). */
  joins: string[];
  /** A mount to detach first: the hybrid cgroup2 mount that Debian's crun refuses. */
  umount: string | undefined;
  /** Overlay lower dirs, top first, checked to be EROFS mounts when `erofs`; none when the bundle names its own root. */
  overlay: { lowers: string[]; erofs: boolean } | undefined;
  runtime: string;
  runtimeRoot: string;
  slot: string;
}

/**
 * Starts containers and swaps the root filesystem of live ones through the agent binary's
 * long-lived `helper` mode (see agent/helper.c), one per backend, started on first use. A request
 * costs a fork of that small process, never a fork of Node (which grows slower as Node's heap
 * grows); the helper is also the reaper of every sandbox's first process.
 */
export class HostHelper {
  private helper: ChildProcess | undefined;
  private readonly pending = new Map<string, Pending>();
  private nextId = 1;

  constructor(private readonly agentPath: string) {}

  /** Gives the sandbox whose first process is host pid `agentPid` the new root. */
  async swap(agentPid: number, root: NewRoot): Promise<void> {
    const fields =
      root.kind === 'overlay'
        ? ['overlay', root.lowers.join(':'), root.upper, root.work, root.lowersAreErofs ? '1' : '0', root.dev]
        : ['bind', root.dir];
    await this.request(['attach', String(agentPid), ...fields], "Cannot swap a sandbox's root");
  }

  /**
   * Makes `path` a btrfs subvolume (unless it is one) whose quota group may reference at most
   * `limitBytes`; returns the subvolume id.
   */
  async subvolume(path: string, limitBytes: number | 'none'): Promise<number> {
    const id = await this.request(['subvol', path, String(limitBytes)], 'Cannot make a capped subvolume');
    return Number(id);
  }

  /** A read-write btrfs snapshot of subvolume `source` at `dest` (which must not exist). */
  async snapshot(source: string, dest: string): Promise<void> {
    await this.request(['snapshot', source, dest], 'Cannot snapshot a writable layer');
  }

  /** Deletes btrfs subvolume `path` and everything in it; a missing one is fine. */
  async deleteSubvolume(path: string): Promise<void> {
    await this.request(['unsubvol', path], 'Cannot delete a subvolume');
  }

  /** Removes the overlay opaque mark of each folder (overlay upper dirs); returns those that had it. */
  async clearOpaque(paths: readonly string[]): Promise<string[]> {
    const had: string[] = [];
    // a request line holds at most ten paths (MAX_FIELDS in agent/helper.c)
    for (let at = 0; at < paths.length; at += 10) {
      const batch = paths.slice(at, at + 10);
      const flags = await this.request(['clearopaque', ...batch], 'Cannot clear an opaque mark');
      batch.forEach((path, i) => {
        if (flags[i] === '1') had.push(path);
      });
    }
    return had;
  }

  /** Starts a container detached; its agent then waits on the FIFO channel in `dir`. */
  async launch(request: LaunchRequest): Promise<void> {
    const fields = [
      request.dir,
      request.joins.length ? request.joins.join(':') : '-',
      request.umount ?? '-',
      request.overlay ? request.overlay.lowers.join(':') : '-',
      request.overlay?.erofs ? '1' : '0',
      request.runtime,
      request.runtimeRoot,
      request.slot,
    ];
    await this.request(['launch', ...fields], 'Cannot start a container');
  }

  private request(fields: string[], what: string): Promise<string> {
    for (const field of fields) {
      if (/[\t\n]/.test(field)) {
        throw new SandgymError('invalid_argument', `${what}: a path contains a tab or newline: ${field}`);
      }
    }
    const id = String(this.nextId++);
    const helper = this.started();
    return new Promise<string>((resolve, reject) => {
      this.pending.set(id, { resolve, reject, what });
      helper.stdin?.write([id, ...fields].join('\t') + '\n');
    });
  }

  private started(): ChildProcess {
    if (this.helper) return this.helper;
    const helper = spawn(this.agentPath, ['helper'], { stdio: ['pipe', 'pipe', 'inherit'] });
    this.helper = helper;
    createInterface({ input: helper.stdout }).on('line', (line) => this.settle(line));
    helper.once('exit', (code, signal) => {
      if (this.helper === helper) this.helper = undefined;
      this.failAll(`the root-swap helper exited (${signal ?? `code ${code}`})`);
    });
    helper.stdin.on('error', () => undefined); // its exit reports the failure
    return helper;
  }

  private settle(line: string): void {
    const [id = '', outcome, message] = line.split('\t');
    const waiter = this.pending.get(id);
    if (!waiter) return;
    this.pending.delete(id);
    if (outcome === 'ok') waiter.resolve(message ?? '');
    else waiter.reject(new SandgymError('platform_error', `${waiter.what}: ${message ?? line}`));
  }

  private failAll(why: string): void {
    for (const waiter of this.pending.values()) {
      waiter.reject(new SandgymError('platform_error', `${waiter.what}: ${why}`, { retryable: true }));
    }
    this.pending.clear();
  }

  /** Stops the helper; requests in flight fail. */
  close(): void {
    this.helper?.stdin?.end();
    this.helper = undefined;
  }
}
