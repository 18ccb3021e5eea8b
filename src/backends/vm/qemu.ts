import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { constants, existsSync, openSync, closeSync } from 'node:fs';
import { access, readFile } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SandgymError, type Codec } from '../../common/index.ts';
import { hostProgram } from '../host/paths.ts';
import { AgentChannel } from '../internal/agent-channel.ts';
import { Qmp } from './qmp.ts';

/** A disk of a VM. */
export interface VmDisk {
  path: string;
  format: 'raw' | 'qcow2';
  readonly: boolean;
}

/** Everything a VM boots from and writes to. */
export interface VmLaunch {
  /** Its folder: initrd, writable disk, sockets, console and QEMU logs. */
  dir: string;
  /** `microvm`: virtio-mmio devices, PVH boot of a vmlinux; `q35`: a PC with PCI devices. */
  machine: 'microvm' | 'q35';
  /** The kernel QEMU loads (a vmlinux for microvm, the image's own vmlinuz for q35). */
  kernel: string;
  initrd: string;
  /** Kernel arguments besides the console and panic ones every VM gets. */
  append: readonly string[];
  /** Disks in order (the guest sees vda, vdb, ...); one of them is the writable disk. */
  disks: readonly VmDisk[];
  /** The disk that holds what the guest writes: what a checkpoint copies. */
  writableDisk: string;
  memoryMib: number;
  cpus: number;
  /** A memory and device snapshot to start from instead of booting (see VmSandbox.checkpoint). */
  incoming?: string;
}

/**
 * KVM where the host has a usable one, else TCG emulation; `$SANDGYM_VM_ACCEL` (`kvm` or `tcg`)
 * decides when set. A `/dev/kvm` served by PVM (the kvm_pvm module, nested virtualisation without
 * hardware support) runs only guests built for PVM, not Debian's kernel: that counts as none.
 */
export async function accelerator(): Promise<'kvm' | 'tcg'> {
  const forced = process.env['SANDGYM_VM_ACCEL'];
  if (forced === 'kvm' || forced === 'tcg') return forced;
  if (existsSync('/sys/module/kvm_pvm')) return 'tcg';
  return access('/dev/kvm', constants.R_OK | constants.W_OK).then(
    () => 'kvm' as const,
    () => 'tcg' as const,
  );
}

/**
 * The host TSC rate in kHz, for the guest's `tsc_early_khz`: under TCG, a microvm guest that
 * calibrates its TSC itself hangs in about one boot in five.
 */
async function tscKhz(): Promise<number | undefined> {
  const mhz = /cpu MHz\s*:\s*([\d.]+)/.exec(await readFile('/proc/cpuinfo', 'utf8'))?.[1];
  return mhz ? Math.round(Number(mhz) * 1000) : undefined;
}

/**
 * QEMU's arguments: a microvm (PVH boot, virtio-mmio devices, no firmware) or a q35 PC (PCI
 * devices), with the kernel loaded by QEMU, the disks, the agent's virtio-serial port, an entropy
 * device and the control socket.
 */
async function qemuArgs(launch: VmLaunch): Promise<string[]> {
  const accel = await accelerator();
  const khz = accel === 'tcg' ? await tscKhz() : undefined;
  const bus = launch.machine === 'microvm' ? 'device' : 'pci';
  const append = [
    'console=ttyS0',
    'quiet',
    'panic=-1',
    ...launch.append,
    ...(khz ? [`tsc_early_khz=${khz}`] : []),
  ];
  const machine = launch.machine === 'microvm' ? 'microvm,x-option-roms=off,rtc=on' : 'q35';
  const args = [
    ...['-M', machine, '-accel', accel, '-cpu', accel === 'kvm' ? 'host' : 'max'],
    ...['-m', `${launch.memoryMib}M`, '-smp', String(Math.max(1, Math.ceil(launch.cpus)))],
    ...['-nodefaults', '-no-user-config', '-nographic', '-no-reboot'],
    ...['-serial', `file:${join(launch.dir, 'console.log')}`],
    ...['-kernel', launch.kernel, '-initrd', launch.initrd, '-append', append.join(' ')],
  ];
  launch.disks.forEach((disk, i) => {
    const access = disk.readonly ? ',readonly=on' : ',discard=unmap';
    args.push('-drive', `id=disk${i},file=${disk.path},format=${disk.format},if=none${access}`);
    args.push('-device', `virtio-blk-${bus},drive=disk${i}`);
  });
  args.push('-device', `virtio-serial-${bus}`);
  // wait=on: QEMU starts the guest only once the node holds the agent's end
  args.push('-chardev', `socket,id=agent,path=${join(launch.dir, 'agent.sock')},server=on,wait=on`);
  args.push('-device', 'virtserialport,chardev=agent,name=sandgym');
  args.push('-device', `virtio-rng-${bus}`);
  args.push('-qmp', `unix:${join(launch.dir, 'qmp.sock')},server=on,wait=off`);
  if (launch.incoming) args.push('-incoming', `exec:cat ${launch.incoming}`);
  return args;
}

/** A running QEMU: its agent channel, its control socket, and when it exits. */
export class QemuVm {
  private constructor(
    readonly process: ChildProcess,
    readonly channel: AgentChannel,
    readonly qmp: Qmp,
    readonly exited: Promise<void>,
  ) {}

  get pid(): number {
    return this.process.pid ?? 0;
  }

  /**
   * Starts QEMU and connects to its agent port and control socket. The channel's `ready` says
   * when the guest's agent is up; callers put a watchdog on it (see {@link QemuVm.waitReady}).
   */
  static async start(launch: VmLaunch, codec: Codec, options: { restoring?: boolean } = {}): Promise<QemuVm> {
    const log = openSync(join(launch.dir, 'qemu.log'), 'a');
    let child: ChildProcess;
    try {
      child = spawn(hostProgram('qemu-system-x86_64'), await qemuArgs(launch), {
        stdio: ['ignore', log, log],
        detached: false,
      });
    } finally {
      closeSync(log);
    }
    const exited = new Promise<void>((resolve) => {
      child.once('exit', () => resolve());
      child.once('error', () => resolve());
    });
    try {
      const socket = await connectWhenListening(join(launch.dir, 'agent.sock'), exited);
      // a restored guest's agent sent its ready long ago: the channel finds it again by a sync
      const channel = new AgentChannel(
        socket,
        socket,
        codec,
        options.restoring ? { resyncMarker: randomBytes(16), firstId: 1 + randomInt(1 << 30) } : {},
      );
      const qmp = await Qmp.connect(join(launch.dir, 'qmp.sock'), 30_000);
      return new QemuVm(child, channel, qmp, exited);
    } catch (error) {
      child.kill('SIGKILL');
      await exited;
      throw new SandgymError(
        'platform_error',
        `QEMU did not start: ${await logTail(launch.dir, 'qemu.log')}`,
        {
          cause: error,
        },
      );
    }
  }

  /** Waits for the guest's agent; a boot past `timeoutMs` (or QEMU exiting) fails with the console's tail. */
  async waitReady(dir: string, timeoutMs: number): Promise<void> {
    const outcome = await Promise.race([
      this.channel.ready.then(
        () => 'ready' as const,
        () => 'exited' as const,
      ),
      this.exited.then(() => 'exited' as const),
      sleep(timeoutMs, 'timeout' as const, { ref: false }),
    ]);
    if (outcome === 'ready') return;
    const console = await logTail(dir, 'console.log');
    const qemu = await logTail(dir, 'qemu.log');
    throw new SandgymError(
      outcome === 'timeout' ? 'timeout' : 'platform_error',
      outcome === 'timeout'
        ? `The VM's agent was not up within ${timeoutMs} ms (console: ${console})`
        : `The VM stopped while booting (console: ${console}; qemu: ${qemu})`,
      { retryable: outcome === 'timeout' },
    );
  }

  /** Ends QEMU at once. */
  async kill(): Promise<void> {
    this.channel.fail(new SandgymError('failed_precondition', 'The VM is closed'));
    this.qmp.close();
    if (this.process.exitCode === null && this.process.signalCode === null) this.process.kill('SIGKILL');
    await this.exited;
  }
}

async function connectWhenListening(path: string, exited: Promise<void>): Promise<Socket> {
  let gone = false;
  void exited.then(() => (gone = true));
  for (let attempt = 0; attempt < 3000 && !gone; attempt++) {
    if (existsSync(path)) {
      try {
        return await new Promise<Socket>((resolve, reject) => {
          const socket = connect(path, () => resolve(socket));
          socket.once('error', reject);
        });
      } catch {
        // not listening yet
      }
    }
    await sleep(10);
  }
  throw new SandgymError('platform_error', `QEMU never opened the agent socket ${path}`);
}

/** The last lines of one of the VM's logs, on one line. */
async function logTail(dir: string, name: string): Promise<string> {
  const text = await readFile(join(dir, name), 'utf8').catch(() => '');
  return text.trim().split('\n').slice(-4).join(' | ') || 'nothing';
}
