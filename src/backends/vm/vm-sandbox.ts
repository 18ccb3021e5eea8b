import { readFile, stat } from 'node:fs/promises';
import { SandgymError } from '../../common/index.ts';
import type { CallOptions, HibernateReport, SandboxSpec, SandboxStats } from '../contract.ts';
import { AgentSandbox } from '../internal/agent-sandbox.ts';
import { throwIfAborted } from '../internal/checks.ts';
import type { QemuVm } from './qemu.ts';

/** What a VM sandbox needs from its backend. */
export interface VmSandboxParts {
  spec: SandboxSpec;
  vm: QemuVm;
  /** The ext4 image of its upper dir. */
  writableDisk: string;
  destroy(sandbox: VmSandbox): Promise<void>;
}

/** Clock ticks per second of /proc/PID/stat's CPU times (USER_HZ, 100 on Linux). */
const TICKS_PER_SECOND = 100;

/**
 * One microVM: the agent as its init, over a virtio-serial port. Pause stops the virtual CPUs
 * (QMP `stop`); memory and CPU are QEMU's own, as the host sees them; OOM kills are the guest
 * kernel's, from its /proc/vmstat.
 */
export class VmSandbox extends AgentSandbox {
  readonly backend = 'microvm' as const;
  private seenOomKills = 0;

  constructor(private readonly parts: VmSandboxParts) {
    super(parts.spec, parts.vm.channel, parts.vm.exited, undefined);
  }

  get vm(): QemuVm {
    return this.parts.vm;
  }

  protected destroy(): Promise<void> {
    return this.parts.destroy(this);
  }

  private async guestOomKills(): Promise<number> {
    const reply = await this.channel.call({ op: 'read', path: '/proc/vmstat', maxBytes: 1 << 16 });
    const text = Buffer.from(reply.data ?? new Uint8Array()).toString();
    return Number(/^oom_kill (\d+)$/m.exec(text)?.[1] ?? 0);
  }

  protected async oomKilledSinceLastCheck(): Promise<boolean> {
    const kills = await this.guestOomKills();
    const killed = kills > this.seenOomKills;
    this.seenOomKills = kills;
    return killed;
  }

  async pause(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Pause');
    if (this.currentState === 'paused') return;
    await this.ready('pause', undefined);
    await this.parts.vm.qmp.execute('stop');
    this.currentState = 'paused';
  }

  async resume(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Resume');
    if (this.currentState !== 'paused') return;
    await this.parts.vm.qmp.execute('cont');
    this.currentState = 'running';
  }

  hibernate(): Promise<HibernateReport> {
    return Promise.reject(
      new SandgymError(
        'unsupported',
        'The microvm backend cannot hibernate yet: pause it, or use a container',
      ),
    );
  }

  async stats(options: CallOptions = {}): Promise<SandboxStats> {
    throwIfAborted(options.signal, 'Stats');
    const pid = this.parts.vm.pid;
    const [status, procStat, disk] = await Promise.all([
      readFile(`/proc/${pid}/status`, 'utf8').catch(() => ''),
      readFile(`/proc/${pid}/stat`, 'utf8').catch(() => ''),
      stat(this.parts.writableDisk).catch(() => undefined),
    ]);
    const rssKib = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1] ?? 0);
    const fields = procStat.slice(procStat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11] ?? 0) + Number(fields[12] ?? 0);
    const running = this.currentState === 'running';
    // the agent counts the guest's processes besides itself; with it, that is what a cgroup counts
    const others = running
      ? await this.channel.call({ op: 'procs' }).then(
          (r) => r.count ?? 0,
          () => 0,
        )
      : 0;
    return {
      state: this.currentState,
      memoryBytes: rssKib * 1024,
      kernelMemoryBytes: 0,
      pids: running ? others + 1 : 0,
      cpuUsageMs: (ticks / TICKS_PER_SECOND) * 1000,
      oomKills: running ? await this.guestOomKills().catch(() => 0) : this.seenOomKills,
      pidsLimitHits: 0,
      deniedEgress: 0,
      // blocks the writable disk's image holds: what the guest wrote, plus ext4's own metadata
      diskBytes: (disk?.blocks ?? 0) * 512,
    };
  }

  /** A microVM has loopback only: it has no network device to open. */
  async setNetwork(rules: readonly string[]): Promise<void> {
    if (rules.length > 0) {
      throw new SandgymError('unsupported', 'A microvm has loopback only: network rules need a container');
    }
    return Promise.resolve();
  }

  /** Its writable layer is inside the guest's disk image; the audit sees no protected paths of it. */
  writtenPaths(): Promise<string[]> {
    return Promise.resolve([]);
  }

  withWritableLayer<T>(): Promise<T> {
    return Promise.reject(
      new SandgymError(
        'unsupported',
        "A microvm's writable layer is inside its disk image: it cannot be packed yet",
      ),
    );
  }

  /** Ends the guest: the agent powers the VM off; QEMU is killed if it lingers. */
  async stopVm(graceMs: number): Promise<void> {
    await this.parts.vm.channel.shutdown(graceMs).catch(() => undefined);
    const stopped = await Promise.race([
      this.parts.vm.exited.then(() => true),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), graceMs).unref()),
    ]);
    if (!stopped) await this.parts.vm.kill();
    else this.parts.vm.qmp.close();
  }
}
