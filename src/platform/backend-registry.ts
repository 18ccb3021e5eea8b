import { existsSync } from 'node:fs';
import { join } from 'node:path';
import {
  BACKEND_NAMES,
  type Backend,
  type BackendName,
  type BackendSandbox,
  type ContainerBackend,
  type FnCallBackend,
  type GcReport,
  type SandboxRecord,
  VmBackend,
} from '../backends/index.ts';
import { SandgymError, type Logger } from '../common/index.ts';

type VmKind = Extract<BackendName, 'microvm' | 'vm'>;

/** What the registry needs to start a VM backend on first use. */
export interface VmBackendSettings {
  dataDir: string;
  /** Where the guest kernel and VM image are kept (in the layer store, shared by nodes). */
  guestDir: string;
  logger: Logger;
  debianMirror: string;
}

/**
 * Every backend of a node, by name: the one place the platform finds the backend that creates a
 * kind of sandbox or holds a sandbox by id, so listing, adoption, lifetime reclaim, gc and
 * packing reach every kind alike. The VM backends start on first use (the first microvm fetches
 * the guest kernel, the first vm builds its image), or when a process before this one used them.
 */
export class BackendRegistry {
  private readonly vms = new Map<VmKind, Promise<VmBackend>>();

  constructor(
    readonly container: ContainerBackend,
    readonly fncall: FnCallBackend,
    private readonly vmSettings: VmBackendSettings,
  ) {}

  /** The backend that creates sandboxes of `name`, started if it was not. */
  async get(name: BackendName): Promise<Backend> {
    switch (name) {
      case 'container':
        return this.container;
      case 'fncall':
        return this.fncall;
      case 'microvm':
      case 'vm':
        return this.vm(name);
    }
  }

  private vm(kind: VmKind): Promise<VmBackend> {
    let opening = this.vms.get(kind);
    if (!opening) {
      opening = VmBackend.create({
        kind,
        ...this.vmSettings,
        flattenStack: (layers, maxDepth) => this.container.flattenStack(layers, maxDepth),
      });
      this.vms.set(kind, opening);
      opening.catch(() => this.vms.delete(kind));
    }
    return opening;
  }

  /** The backends this process or another on the data dir has used; none is started for nothing. */
  async inUse(): Promise<Backend[]> {
    const used = BACKEND_NAMES.filter(
      (name) =>
        name === 'container' ||
        name === 'fncall' ||
        this.vms.has(name) ||
        existsSync(join(this.vmSettings.dataDir, `${name}s`)),
    );
    return Promise.all(used.map((name) => this.get(name)));
  }

  /**
   * The backends this process started: the only ones holding sandboxes of this process. What the
   * lifetime sweep walks, so it never starts a VM backend just because an earlier process used one.
   */
  private async started(): Promise<Backend[]> {
    const vms = await Promise.all([...this.vms.values()].map((opening) => opening.catch(() => undefined)));
    return [this.container, this.fncall, ...vms.filter((vm): vm is VmBackend => vm !== undefined)];
  }

  /** The backend holding sandbox `id` on this node (this process's first), or `not_found`. */
  async ownerOf(id: string): Promise<Backend> {
    const mine = (await this.started()).find((backend) => backend.live().some((s) => s.id === id));
    if (mine) return mine;
    for (const backend of await this.inUse()) if (await backend.holds(id)) return backend;
    throw new SandgymError('not_found', `No sandbox "${id}" on this node: see "sandgym ps"`);
  }

  /** This process's live sandboxes of every backend. */
  async live(): Promise<BackendSandbox[]> {
    return (await this.started()).flatMap((backend) => backend.live());
  }

  async list(): Promise<SandboxRecord[]> {
    const lists = await Promise.all((await this.inUse()).map((backend) => backend.list()));
    return lists.flat();
  }

  async adopt(): Promise<BackendSandbox[]> {
    const adopted: BackendSandbox[] = [];
    for (const backend of await this.inUse()) adopted.push(...(await backend.adopt()));
    return adopted;
  }

  async reclaimExpired(now = Date.now()): Promise<string[]> {
    const reclaimed: string[] = [];
    for (const backend of await this.started()) reclaimed.push(...(await backend.reclaimExpired(now)));
    return reclaimed;
  }

  async gc(): Promise<GcReport> {
    const report: GcReport = { sandboxes: [], mounts: [], cgroups: [] };
    for (const backend of await this.inUse()) {
      const more = await backend.gc();
      report.sandboxes.push(...more.sandboxes);
      report.mounts.push(...more.mounts);
      report.cgroups.push(...more.cgroups);
    }
    return report;
  }

  /** Closes every backend this process started: FnCall first (its workers are containers), containers last. */
  async close(): Promise<void> {
    await this.fncall.close();
    for (const opening of this.vms.values()) await (await opening.catch(() => undefined))?.close();
    await this.container.close();
  }
}
