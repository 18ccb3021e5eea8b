import { readdir, mkdir, rm } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { SandgymError, messageOf } from '../../common/index.ts';
import type { LayerImage, SandboxSpec } from '../contract.ts';
import { baselineOf, cgroupLimitsOf } from '../host/cgroups.ts';
import type { LayerMounts } from '../host/layer-mounts.ts';
import type { ContainerSandbox } from './container-sandbox.ts';
import type { ContainerEgress } from './egress.ts';
import type { ContainerLauncher } from './launch.ts';
import type { WarmShell } from './warm-pool.ts';

/** How long an agent may take to end a tenant's processes and take its new root. */
const RESET_TIMEOUT_MS = 10_000;

/**
 * Reusing a container for another tenant, or for the next call of the same one: a fresh overlay
 * of layers swapped in under its running agent, the tenant's limits written, and a scrub that
 * leaves nothing of a tenant behind (checked, not assumed) before a shell goes back to the pool.
 */
export class ContainerReuse {
  private renewals = 0;

  constructor(
    private readonly launcher: ContainerLauncher,
    private readonly mounts: LayerMounts,
    private readonly egress: ContainerEgress,
  ) {}

  /**
   * Mounts a fresh overlay of `layers` (upper and work dirs `upper<suffix>`, `work<suffix>` in
   * the slot's capped `rw` subvolume) and makes it the container's root. The layer mounts stay acquired for it; on
   * failure nothing stays acquired or created.
   */
  async swapInOverlay(
    shell: WarmShell,
    agentPid: number,
    layers: readonly LayerImage[],
    suffix: string,
    dev: 'fresh' | 'keep',
  ): Promise<string> {
    const dir = this.launcher.pathsOf(shell.slot).dir;
    const upper = join(dir, 'rw', `upper${suffix}`);
    const work = join(dir, 'rw', `work${suffix}`);
    const made =
      suffix === '' && shell.writableDirsReady
        ? Promise.resolve()
        : Promise.all([upper, work].map((d) => mkdir(d, { recursive: true })));
    shell.writableDirsReady = false;
    let points: string[];
    try {
      points = await this.mounts.acquire(layers);
    } catch (error) {
      await made.catch(() => undefined);
      await Promise.all([upper, work].map((d) => rm(d, { recursive: true, force: true })));
      throw error;
    }
    try {
      await made;
      // overlay lists lower dirs top first; layers come base first
      const lowers = [...points].reverse();
      await this.launcher.options.helper.swap(agentPid, {
        kind: 'overlay',
        lowers,
        upper,
        work,
        lowersAreErofs: true,
        dev,
      });
      return upper;
    } catch (error) {
      this.mounts.release(layers);
      await Promise.all([upper, work].map((d) => rm(d, { recursive: true, force: true })));
      throw error;
    }
  }

  /** Makes a pooled shell's empty upper and work dirs ahead of its next tenant, who then waits for neither. */
  async prepareWritableDirs(shell: WarmShell): Promise<void> {
    const rw = join(this.launcher.pathsOf(shell.slot).dir, 'rw');
    await Promise.all(['upper', 'work'].map((d) => mkdir(join(rw, d), { recursive: true })));
    shell.writableDirsReady = true;
  }

  /** Writes the tenant's cgroup limits, unless the container has them already. */
  async applyLimits(shell: WarmShell, spec: SandboxSpec): Promise<void> {
    const limits = cgroupLimitsOf(spec.resources, spec.qos);
    const key = JSON.stringify(limits);
    if (shell.limits === key) return;
    await shell.cgroup.applyLimits(limits);
    shell.limits = key;
  }

  /**
   * Leaves nothing of a tenant in its container: every process ended (the agent as pid 1 kills
   * the whole pid namespace and reaps it), the cgroup checked to hold the agent alone, then the
   * empty shell root swapped in, which also brings a fresh /dev and removes every IPC object;
   * the tenant's upper dir is deleted; its network namespace holds loopback, and its veth on the
   * node network made new when it has one (every group network left). False when any of it fails:
   * the caller destroys it instead.
   */
  async scrub(shell: WarmShell): Promise<boolean> {
    return (await this.endTenant(shell)) && this.makeReady(shell);
  }

  /**
   * The first part of a scrub, all its tenant waits for: every process of the tenant ended, the
   * cgroup checked to hold the agent alone. False when it fails: the caller destroys it instead.
   */
  async endTenant(shell: WarmShell): Promise<boolean> {
    try {
      await shell.cgroup.setFrozen(false);
      await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS });
      shell.agentPid = await soleProcess(shell);
      // no tenant's from here: listings leave it out, and a successor after a crash reaps it
      await this.launcher.saveState(
        this.launcher.pathsOf(shell.slot).dir,
        this.launcher.pooledState(shell.slot),
      );
      return true;
    } catch (error) {
      this.cannotScrub(shell, error);
      return false;
    }
  }

  /** The rest of a scrub, once {@link endTenant} left the agent alone in it. */
  async makeReady(shell: WarmShell): Promise<boolean> {
    try {
      const agentPid = shell.agentPid ?? (await soleProcess(shell));
      // with the tenant's processes gone, none can open a flow after its network is made new:
      // off every group network; a veth on the node network stays, as new (see recycle)
      await this.egress.recycle(shell);
      await this.checkAgentUnchanged(shell);
      await shell.cgroup.resetMemoryWatermark();
      await this.launcher.options.helper.swap(agentPid, { kind: 'bind', dir: this.launcher.shellRoot });
      // the agent lets go of the tenant's root here: its handle on it is the last reference to
      // the detached overlay, and dropping that tears the overlay down (1-2 ms), which belongs
      // in this destroy rather than in the next tenant's create
      await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS });
      const paths = this.launcher.pathsOf(shell.slot);
      await removeWritableLayers(paths.dir);
      await this.prepareWritableDirs(shell);
      shell.pooledBaseline = baselineOf(await shell.cgroup.usage());
      return true;
    } catch (error) {
      this.cannotScrub(shell, error);
      return false;
    }
  }

  private cannotScrub(shell: WarmShell, error: unknown): void {
    this.launcher.options.logger.warn(
      { slot: shell.slot, error: messageOf(error) },
      'cannot scrub a container for reuse; destroying it',
    );
  }

  /**
   * Fails unless the container's agent shows the process state it started with: a tenant's
   * process may have lowered its limits, reniced it or moved its CPUs (all allowed to a process
   * of the same uid), and every command of the next tenant would inherit that.
   */
  private async checkAgentUnchanged(shell: WarmShell): Promise<void> {
    const now = (await shell.channel.call({ op: 'procstate' }, { timeoutMs: RESET_TIMEOUT_MS })).state;
    if (shell.agentState === undefined || now !== shell.agentState) {
      throw new SandgymError(
        'failed_precondition',
        `The agent of container ${shell.slot} was changed by its tenant (limits, priority or CPUs): it is not reused`,
      );
    }
  }

  /**
   * Whether a sandbox of this process holds anything beyond its image: a process besides its
   * agent, a written file, something in /dev/shm or /dev/mqueue, or an agent whose process state
   * changed. What a stateless caller (FnCall) checks between two calls before reusing the sandbox.
   */
  async holdsState(sandbox: ContainerSandbox): Promise<boolean> {
    const shell = this.launcher.containers.get(sandbox.slot);
    if (!shell) return true;
    const pids = await shell.cgroup.members();
    if (pids.length !== 1 || pids[0] === undefined) return true;
    // a call that changed its agent's process state holds state no fresh root takes away; what
    // the last command's end reported serves when nothing else was left to change it since
    const state =
      sandbox.agentStateWhenLastAlone ??
      (await shell.channel.call({ op: 'procstate' }, { timeoutMs: RESET_TIMEOUT_MS })).state;
    if (state !== shell.agentState) return true;
    const root = `/proc/${pids[0]}/root`;
    for (const dir of [sandbox.upperDir, `${root}/dev/shm`, `${root}/dev/mqueue`]) {
      if ((await readdir(dir).catch(() => ['unreadable'])).length > 0) return true;
    }
    return false;
  }

  /**
   * Gives a sandbox of this process a fresh root over its own layers, as if it were just created:
   * every process but the agent ended, a new empty upper dir, a fresh /dev, IPC purged. The
   * container, its cgroups and its agent stay. What FnCall does between calls that left state.
   * Fails when the agent's own process state was changed: no new root undoes that.
   */
  async renewRoot(sandbox: ContainerSandbox): Promise<void> {
    const shell = this.launcher.containers.get(sandbox.slot);
    if (!shell) throw new SandgymError('not_found', `No live sandbox "${sandbox.id}" of this process`);
    await shell.cgroup.setFrozen(false);
    await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS });
    shell.agentPid = await soleProcess(shell);
    await this.checkAgentUnchanged(shell);
    const upper = await this.swapInOverlay(
      shell,
      shell.agentPid,
      sandbox.layers,
      `-${++this.renewals}`,
      'fresh',
    );
    this.mounts.release(sandbox.layers); // the old root's hold is the new root's now
    const old = sandbox.upperDir;
    sandbox.rebase(upper);
    await shell.channel.call({ op: 'reset' }, { timeoutMs: RESET_TIMEOUT_MS }); // takes the new root
    const oldWork = join(dirname(old), basename(old).replace(/^upper/, 'work'));
    await Promise.all([old, oldWork].map((d) => rm(d, { recursive: true, force: true, maxRetries: 3 })));
  }
}

/** The host pid of a container's agent, when it is the only process left: the check that a scrub worked. */
export async function soleProcess(shell: WarmShell): Promise<number> {
  const pids = await shell.cgroup.members();
  if (pids.length !== 1 || pids[0] === undefined) {
    throw new SandgymError(
      'platform_error',
      `Container ${shell.slot} holds ${pids.length} processes, not its agent alone`,
    );
  }
  return pids[0];
}

/** Removes every upper and work dir of a container's folder (a renewed root leaves numbered ones). */
async function removeWritableLayers(dir: string): Promise<void> {
  const rw = join(dir, 'rw');
  const names = (await readdir(rw)).filter((name) => /^(upper|work)(-\d+)?$/.test(name));
  await Promise.all(names.map((name) => rm(join(rw, name), { recursive: true, force: true, maxRetries: 3 })));
}
