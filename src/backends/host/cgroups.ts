import { readFile, writeFile, rmdir, mkdir, readdir } from 'node:fs/promises';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createHash } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { SandgymError } from '../../common/index.ts';
import type { QosClass, SandboxResources } from '../contract.ts';
import { readMounts } from './mountinfo.ts';

/**
 * Where this host keeps its cgroups. Detected, never assumed:
 * - `v2`: one unified hierarchy at /sys/fs/cgroup;
 * - `v1`: one hierarchy per controller, and maybe (hybrid) a controller-less cgroup2 mount.
 */
export type CgroupLayout =
  | { kind: 'v2'; root: string }
  | { kind: 'v1'; controllers: Record<string, string>; unified: string | undefined };

/** Reads the host's cgroup mounts. */
export async function detectCgroupLayout(): Promise<CgroupLayout> {
  const mounts = await readMounts();
  const rootV2 = mounts.find((m) => m.fsType === 'cgroup2' && m.mountPoint === '/sys/fs/cgroup');
  if (rootV2) return { kind: 'v2', root: rootV2.mountPoint };
  const controllers: Record<string, string> = {};
  let unified: string | undefined;
  for (const m of mounts) {
    if (m.fsType === 'cgroup2') unified ??= m.mountPoint;
    if (m.fsType !== 'cgroup') continue;
    const name = m.mountPoint.split('/').pop() ?? '';
    for (const controller of name.split(',')) controllers[controller] ??= m.mountPoint;
  }
  for (const needed of ['memory', 'pids', 'cpu']) {
    if (!controllers[needed]) {
      throw new SandgymError(
        'failed_precondition',
        `The cgroup v1 "${needed}" controller is not mounted on this host`,
      );
    }
  }
  return { kind: 'v1', controllers, unified };
}

/**
 * The top-level cgroup folder sandgym sandboxes live under, by CPU class, in every hierarchy.
 * Best-effort sandboxes get a parent of their own, marked idle (see {@link markIdleParent}):
 * SCHED_IDLE and the lowest weight rank a sandbox only against its siblings, while each of its
 * ancestors competes at its own weight with everything at its level. Under `sandgym`, a busy
 * best-effort sandbox alone on a CPU carried `sandgym`'s full weight against the host's tasks,
 * the node's own event loop included, so the step of a latency sandbox waited on it.
 */
const CGROUP_PARENTS: Record<QosClass, string> = { latency: 'sandgym', best_effort: 'sandgym-best-effort' };

/**
 * Sandboxes are grouped by the data folder that owns them (`sandgym/<scope>/<id>`), so that
 * reaping one node's residue can never touch another's sandboxes on the same host.
 */
export function cgroupScope(dataDir: string): string {
  return createHash('sha256').update(dataDir).digest('hex').slice(0, 12);
}

async function readText(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch {
    return undefined;
  }
}

/**
 * A small kernel file read synchronously: for the few counters a step reads, one blocking read of
 * a few microseconds beats four thread-pool hops (open, stat, read, close) per file.
 */
function readTextNow(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}

/** What a step reports from its sandbox's cgroup (see {@link SandboxCgroup.stepCounters}). */
export interface StepCgroupCounters {
  pids: number;
  oomKills: number;
  pidsLimitHits: number;
  /** One of its processes, whose network namespace is the sandbox's; undefined when it has none. */
  anyPid: number | undefined;
}

function counter(text: string | undefined, key: string): number {
  const line = text?.split('\n').find((l) => l.startsWith(`${key} `));
  return line ? Number(line.slice(key.length + 1)) : 0;
}

/** The cgroup limits a sandbox's resources and CPU class come to. */
export interface CgroupLimits {
  memoryBytes: number;
  pids: number;
  cpuQuotaUs: number;
  cpuPeriodUs: number;
  /** v1 cpu.shares: a best-effort sandbox gets the lowest the kernel allows. */
  cpuShares: number;
}

const CPU_PERIOD_US = 100_000;

export function cgroupLimitsOf(resources: SandboxResources, qos: QosClass): CgroupLimits {
  return {
    memoryBytes: resources.memoryMib * 1024 * 1024,
    pids: resources.pids,
    cpuQuotaUs: Math.max(1000, Math.round(resources.cpu * CPU_PERIOD_US)),
    cpuPeriodUs: CPU_PERIOD_US,
    cpuShares: qos === 'latency' ? 1024 : 2,
  };
}

/** Measured use of one sandbox cgroup. */
export interface CgroupUsage {
  memoryBytes: number;
  /** Of it, kernel memory charged to the cgroup. */
  kernelMemoryBytes: number;
  pids: number;
  cpuUsageMs: number;
  oomKills: number;
  /**
   * Times the sandbox ran into its own memory limit: v2 counts its memcg's OOM events; v1 has no
   * such counter (its failcnt stays 0 here), so it is 1 once the usage watermark reached the
   * limit (see {@link SandboxCgroup.resetMemoryWatermark}). An OOM kill with one of these is the
   * sandbox's doing; without, the host's OOM killer chose it.
   */
  memoryLimitHits: number;
  /** Forks refused at the pids limit. */
  pidsLimitHits: number;
}

/** Counters a sandbox's stats start from: what its container ran up before it (a warm shell). */
export type UsageBaseline = Pick<
  CgroupUsage,
  'cpuUsageMs' | 'oomKills' | 'pidsLimitHits' | 'memoryLimitHits'
>;

/** The counters of a reading that a later tenant's stats start from. */
export function baselineOf(usage: CgroupUsage): UsageBaseline {
  return {
    cpuUsageMs: usage.cpuUsageMs,
    oomKills: usage.oomKills,
    pidsLimitHits: usage.pidsLimitHits,
    memoryLimitHits: usage.memoryLimitHits,
  };
}

/**
 * The cgroups of one sandbox. The OCI runtime creates and limits them from the bundle's
 * `cgroupsPath`; this class reads them, freezes them and removes what a crash left behind.
 */
export class SandboxCgroup {
  /** Relative path inside each hierarchy, as the runtime's cgroupsPath. */
  readonly relativePath: string;

  constructor(
    private readonly layout: CgroupLayout,
    scope: string,
    sandboxId: string,
    readonly qos: QosClass,
  ) {
    this.relativePath = sandboxCgroupPath(scope, sandboxId, qos);
  }

  /** The cgroups of a sandbox found on the node, whose class the parent that holds them tells. */
  static existing(layout: CgroupLayout, scope: string, sandboxId: string): SandboxCgroup {
    const bestEffort = new SandboxCgroup(layout, scope, sandboxId, 'best_effort');
    return bestEffort.allPaths().some((path) => existsSync(path))
      ? bestEffort
      : new SandboxCgroup(layout, scope, sandboxId, 'latency');
  }

  /**
   * The cgroup2 leaf used for freezing on a hybrid host. The runtime manages only the v1
   * hierarchies there, so the launcher joins this leaf itself (see agent/launch.c).
   */
  get freezeLeaf(): string | undefined {
    return this.layout.kind === 'v1' && this.layout.unified
      ? join(this.layout.unified, this.relativePath)
      : undefined;
  }

  /**
   * Creates what the runtime does not: the idle parent of best-effort sandboxes (made again
   * each time, since the last sandbox's close removes it) and the hybrid freeze leaf. Returns
   * files the launcher joins.
   */
  async prepare(): Promise<string[]> {
    if (this.qos === 'best_effort') await markIdleParent(this.layout);
    const leaf = this.freezeLeaf;
    if (!leaf) return [];
    await mkdir(leaf, { recursive: true });
    return [join(leaf, 'cgroup.procs')];
  }

  /** Every folder of this sandbox, in every hierarchy. */
  allPaths(): string[] {
    if (this.layout.kind === 'v2') return [join(this.layout.root, this.relativePath)];
    const paths = [...new Set(Object.values(this.layout.controllers))].map((m) => join(m, this.relativePath));
    const leaf = this.freezeLeaf;
    return leaf ? [...paths, leaf] : paths;
  }

  private v1(controller: string, file: string): string {
    if (this.layout.kind !== 'v1') throw new Error('not a v1 host');
    return join(this.layout.controllers[controller] ?? '', this.relativePath, file);
  }

  private v2(file: string): string {
    if (this.layout.kind !== 'v2') throw new Error('not a v2 host');
    return join(this.layout.root, this.relativePath, file);
  }

  /** Memory, pids, CPU time and OOM kills, straight from the kernel's counters. */
  async usage(): Promise<CgroupUsage> {
    if (this.layout.kind === 'v2') {
      const [memory, pids, cpu, events, stat, pidsEvents] = await Promise.all([
        readText(this.v2('memory.current')),
        readText(this.v2('pids.current')),
        readText(this.v2('cpu.stat')),
        readText(this.v2('memory.events')),
        readText(this.v2('memory.stat')),
        readText(this.v2('pids.events')),
      ]);
      return {
        memoryBytes: Number(memory ?? 0),
        kernelMemoryBytes: counter(stat, 'kernel'),
        pids: Number(pids ?? 0),
        cpuUsageMs: counter(cpu, 'usage_usec') / 1000,
        oomKills: counter(events, 'oom_kill'),
        memoryLimitHits: counter(events, 'oom'),
        pidsLimitHits: counter(pidsEvents, 'max'),
      };
    }
    const [memory, pids, cpu, oom, kernel, pidsEvents, peak, limit] = await Promise.all([
      readText(this.v1('memory', 'memory.usage_in_bytes')),
      readText(this.v1('pids', 'pids.current')),
      readText(this.v1('cpuacct', 'cpuacct.usage')),
      readText(this.v1('memory', 'memory.oom_control')),
      readText(this.v1('memory', 'memory.kmem.usage_in_bytes')),
      readText(this.v1('pids', 'pids.events')),
      readText(this.v1('memory', 'memory.max_usage_in_bytes')),
      readText(this.v1('memory', 'memory.limit_in_bytes')),
    ]);
    return {
      memoryBytes: Number(memory ?? 0),
      kernelMemoryBytes: Number(kernel ?? 0),
      pids: Number(pids ?? 0),
      cpuUsageMs: Number(cpu ?? 0) / 1e6,
      oomKills: counter(oom, 'oom_kill'),
      memoryLimitHits: peak !== undefined && Number(peak) >= Number(limit ?? Infinity) ? 1 : 0,
      pidsLimitHits: counter(pidsEvents, 'max'),
    };
  }

  /**
   * The counters a step needs, and only those, read without leaving the event loop: the pids
   * count, OOM kills, forks refused at the pids limit, and one process to find the network by.
   */
  stepCounters(): StepCgroupCounters {
    const [pids, events, memoryEvents, procs] =
      this.layout.kind === 'v2'
        ? ['pids.current', 'pids.events', 'memory.events', 'cgroup.procs'].map((f) => readTextNow(this.v2(f)))
        : [
            readTextNow(this.v1('pids', 'pids.current')),
            readTextNow(this.v1('pids', 'pids.events')),
            readTextNow(this.v1('memory', 'memory.oom_control')),
            readTextNow(this.v1('pids', 'cgroup.procs')),
          ];
    const first = procs?.slice(0, procs.indexOf('\n'));
    return {
      pids: Number(pids ?? 0),
      oomKills: counter(memoryEvents, 'oom_kill'),
      pidsLimitHits: counter(events, 'max'),
      anyPid: first ? Number(first) : undefined,
    };
  }

  /** Starts the v1 memory watermark anew, so a scrubbed container's next tenant is judged on its own use. */
  async resetMemoryWatermark(): Promise<void> {
    if (this.layout.kind === 'v1') await writeFile(this.v1('memory', 'memory.max_usage_in_bytes'), '0');
  }

  /**
   * Sets the limits of a live sandbox, as the runtime sets them at creation: a warm sandbox gets
   * its tenant's. Memory and swap together may not exceed the memory limit (the swap ceiling is
   * raised first when the limit grows, lowered last when it shrinks).
   */
  async applyLimits(limits: CgroupLimits): Promise<void> {
    if (this.layout.kind === 'v2') {
      await writeFile(this.v2('memory.max'), String(limits.memoryBytes));
      await writeFile(this.v2('memory.swap.max'), '0');
      await writeFile(this.v2('pids.max'), String(limits.pids));
      await writeFile(this.v2('cpu.max'), `${limits.cpuQuotaUs} ${limits.cpuPeriodUs}`);
      // the runtime's conversion of shares to weight
      await writeFile(
        this.v2('cpu.weight'),
        String(1 + Math.floor(((limits.cpuShares - 2) * 9999) / 262142)),
      );
      return;
    }
    const memory = this.v1('memory', 'memory.limit_in_bytes');
    const withSwap = this.v1('memory', 'memory.memsw.limit_in_bytes');
    const hasSwapFile = (await readText(withSwap)) !== undefined;
    const order = hasSwapFile ? [memory, withSwap] : [memory];
    const grown = await writeFile(memory, String(limits.memoryBytes)).then(
      () => false,
      () => true, // above the swap ceiling: raise that first
    );
    for (const file of grown ? order.reverse() : order.slice(1))
      await writeFile(file, String(limits.memoryBytes));
    await writeFile(this.v1('pids', 'pids.max'), String(limits.pids));
    await writeFile(this.v1('cpu', 'cpu.cfs_period_us'), String(limits.cpuPeriodUs));
    await writeFile(this.v1('cpu', 'cpu.cfs_quota_us'), String(limits.cpuQuotaUs));
    await writeFile(this.v1('cpu', 'cpu.shares'), String(limits.cpuShares));
  }

  /** Freezes (or thaws) every process of the sandbox and waits until the kernel reports it done. */
  async setFrozen(frozen: boolean): Promise<void> {
    const v2Dir = this.layout.kind === 'v2' ? join(this.layout.root, this.relativePath) : this.freezeLeaf;
    if (v2Dir) {
      await writeFile(join(v2Dir, 'cgroup.freeze'), frozen ? '1' : '0');
      await this.waitFor(join(v2Dir, 'cgroup.events'), (t) => counter(t, 'frozen') === (frozen ? 1 : 0));
      return;
    }
    const state = this.v1('freezer', 'freezer.state');
    await writeFile(state, frozen ? 'FROZEN' : 'THAWED');
    await this.waitFor(state, (t) => t.trim() === (frozen ? 'FROZEN' : 'THAWED'));
  }

  /**
   * Pushes the sandbox's reclaimable memory out (page cache always; anonymous memory to swap
   * where the node has swap): cgroup v2's memory.reclaim, or on v1 a brief squeeze of the limit.
   * Best effort; returns the bytes its usage dropped by.
   */
  async reclaim(): Promise<number> {
    const before = (await this.usage()).memoryBytes;
    if (this.layout.kind === 'v2') {
      await writeFile(this.v2('memory.reclaim'), String(before)).catch(() => undefined); // EAGAIN: did what it could
    } else {
      const limitFile = this.v1('memory', 'memory.limit_in_bytes');
      const limit = await readText(limitFile);
      // the kernel reclaims down to a lowered limit (anonymous memory to swap, where there is
      // swap), or refuses (EBUSY) when it cannot; the floor is what the agent itself needs
      for (const fraction of [0, 0.25, 0.5, 0.75]) {
        const target = Math.max(1024 * 1024, Math.floor(before * fraction));
        if (
          await writeFile(limitFile, String(target)).then(
            () => true,
            () => false,
          )
        )
          break;
      }
      if (limit) await writeFile(limitFile, limit.trim());
    }
    return Math.max(0, before - (await this.usage()).memoryBytes);
  }

  /** Bytes of the sandbox's memory now on swap. */
  async swappedBytes(): Promise<number> {
    if (this.layout.kind === 'v2') return Number((await readText(this.v2('memory.swap.current'))) ?? 0);
    return counter(await readText(this.v1('memory', 'memory.stat')), 'swap');
  }

  /** True while the sandbox is frozen. */
  async isFrozen(): Promise<boolean> {
    const v2Dir = this.layout.kind === 'v2' ? join(this.layout.root, this.relativePath) : this.freezeLeaf;
    if (v2Dir) return counter(await readText(join(v2Dir, 'cgroup.events')), 'frozen') === 1;
    return (await readText(this.v1('freezer', 'freezer.state')))?.trim() === 'FROZEN';
  }

  private async waitFor(file: string, done: (text: string) => boolean): Promise<void> {
    for (let delayMs = 1; delayMs < 2000; delayMs *= 2) {
      if (done((await readText(file)) ?? '')) return;
      await sleep(delayMs);
    }
    throw new SandgymError('platform_error', `Timed out waiting for ${file} to change state`, {
      retryable: true,
    });
  }

  /** Pids of the sandbox's processes from the one hierarchy that counts them all (pids), read cheaply. */
  async members(): Promise<number[]> {
    const dir = this.layout.kind === 'v2' ? join(this.layout.root, this.relativePath) : this.v1('pids', '');
    const text = await readText(join(dir, 'cgroup.procs'));
    return (text?.split('\n') ?? []).filter(Boolean).map(Number);
  }

  /** Pids of every process in the sandbox, from all hierarchies. */
  async processes(): Promise<number[]> {
    const pids = new Set<number>();
    for (const dir of this.allPaths()) {
      const text = await readText(join(dir, 'cgroup.procs'));
      for (const line of text?.split('\n') ?? []) if (line) pids.add(Number(line));
    }
    return [...pids];
  }

  /** Removes the sandbox's folders; a folder still holding processes is retried briefly. */
  async remove(): Promise<string[]> {
    const removed: string[] = [];
    for (const dir of this.allPaths()) {
      for (let attempt = 0; ; attempt++) {
        try {
          await rmdir(dir);
          removed.push(dir);
          break;
        } catch (error) {
          const code = (error as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') break;
          if (code !== 'EBUSY' || attempt >= 40) {
            throw new SandgymError('platform_error', `Cannot remove cgroup ${dir}: ${code}`, {
              cause: error,
            });
          }
          await sleep(25);
        }
      }
    }
    return removed;
  }
}

/** A sandbox's cgroup path inside each hierarchy, as the runtime's cgroupsPath takes it. */
export function sandboxCgroupPath(scope: string, sandboxId: string, qos: QosClass): string {
  return `${CGROUP_PARENTS[qos]}/${scope}/${sandboxId}`;
}

/**
 * Makes the best-effort parent in the CPU hierarchy and marks it idle (cpu.idle, Linux 5.15 and
 * later), so at the root its whole subtree runs only when nothing else on the host wants the
 * CPU; a kernel without cpu.idle gets the lowest weight instead. Best effort: a host whose cpu
 * controller is not enabled there keeps the class's SCHED_IDLE and leaf weight.
 */
async function markIdleParent(layout: CgroupLayout): Promise<void> {
  const cpuRoot = layout.kind === 'v2' ? layout.root : layout.controllers['cpu'];
  if (!cpuRoot) return;
  const dir = join(cpuRoot, CGROUP_PARENTS.best_effort);
  await mkdir(dir, { recursive: true });
  const lowest = layout.kind === 'v2' ? ['cpu.weight', '1'] : ['cpu.shares', '2'];
  for (const [file, value] of [['cpu.idle', '1'], lowest] as const) {
    if (
      await writeFile(join(dir, file), value).then(
        () => true,
        () => false,
      )
    )
      return;
  }
}

function hierarchyRoots(layout: CgroupLayout): string[] {
  return layout.kind === 'v2'
    ? [layout.root]
    : [...new Set(Object.values(layout.controllers)), ...(layout.unified ? [layout.unified] : [])];
}

/** Removes the scope's parent folders once no sandbox uses them; a busy one stays. */
export async function removeIdleParents(layout: CgroupLayout, scope: string): Promise<void> {
  for (const root of hierarchyRoots(layout)) {
    for (const parent of Object.values(CGROUP_PARENTS)) {
      await rmdir(join(root, parent, scope)).catch(() => undefined);
      await rmdir(join(root, parent)).catch(() => undefined);
    }
  }
}

/** Sandbox ids of one scope that have a cgroup folder in any hierarchy of this host. */
export async function listSandboxCgroups(layout: CgroupLayout, scope: string): Promise<string[]> {
  const ids = new Set<string>();
  for (const root of hierarchyRoots(layout)) {
    for (const parent of Object.values(CGROUP_PARENTS)) {
      try {
        for (const entry of await readdir(join(root, parent, scope), { withFileTypes: true })) {
          if (entry.isDirectory()) ids.add(entry.name);
        }
      } catch {
        // no such folder in this hierarchy
      }
    }
  }
  return [...ids];
}
