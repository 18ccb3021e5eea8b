import { randomBytes, randomInt } from 'node:crypto';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SandgymError, messageOf, type Codec, type Logger } from '../../common/index.ts';
import type { CallOptions, SandboxSpec } from '../contract.ts';
import { SandboxCgroup, cgroupLimitsOf, type CgroupLayout } from '../host/cgroups.ts';
import type { HostHelper } from '../host/host-helper.ts';
import type { ProcessIdentity } from '../host/processes.ts';
import type { ScratchSlot } from '../host/scratch-volume.ts';
import { AgentChannel } from '../internal/agent-channel.ts';
import type { AgentReady } from '../internal/agent-protocol.ts';
import { channelFifos, openPipe } from '../internal/channel-fifos.ts';
import type { ContainerEgress } from './egress.ts';
import { buildOciConfig } from './oci-config.ts';
import { removeContainerResidue, type ContainerPaths } from './residue.ts';
import { writeContainerState, type ContainerState } from './sandbox-record.ts';
import type { WarmShell } from './warm-pool.ts';

/** What launching a container takes on this node: found once, when the backend opens. */
export interface LaunchSettings {
  /** The node's data folder, resolved. */
  dataDir: string;
  /** Containers outlive this process, for a successor to adopt. */
  durable: boolean;
  /** How long a container may take to report ready. */
  startTimeoutMs?: number | undefined;
  /** How long a closing container gets to exit before it is killed. */
  stopGraceMs?: number | undefined;
  layout: CgroupLayout;
  /** The cgroup subtree of this data dir's sandboxes. */
  scope: string;
  owner: ProcessIdentity;
  agentPath: string;
  runtime: string;
  helper: HostHelper;
  /** Whether agents may hold CAP_SYS_RESOURCE to keep out of the OOM killer's reach. */
  hostHasSysResource: boolean;
  codec: Codec;
  logger: Logger;
  egress: ContainerEgress;
}

/**
 * Starts and ends this process's containers: writes each one's record and OCI config, launches
 * crun through the host helper, waits for its agent, and tears it down, graceful first. Every
 * running container of the process is in {@link containers}, tenants' and pooled shells alike.
 */
export class ContainerLauncher {
  /** Every running container of this process, by slot. */
  readonly containers = new Map<string, WarmShell>();
  /** Containers this process started: its close waits for their slots to go before unmounting. */
  containersMade = 0;

  constructor(readonly options: LaunchSettings) {}

  /** A container's things on the node, by slot: its sandbox id when created cold, a `warm-…` name when pooled. */
  pathsOf(slot: string): ContainerPaths {
    return {
      dir: join(this.options.dataDir, 'sandboxes', slot),
      runtimeRoot: join(this.options.dataDir, 'runtime'),
      runtime: this.options.runtime,
      deleteSubvolume: (path) => this.options.helper.deleteSubvolume(path),
    };
  }

  /** Durable sandboxes' state must survive a power loss; the others' only a crash of this process. */
  saveState(dir: string, state: ContainerState): Promise<void> {
    return writeContainerState(dir, state, this.options.durable ?? false);
  }

  /** The empty, read-only root of every pooled shell: mount points and the staging dir of a root swap. */
  get shellRoot(): string {
    return join(this.options.dataDir, 'shell-root');
  }

  /** The state of a shell waiting in the pool: no tenant, no layers. */
  pooledState(slot: string): ContainerState {
    return {
      id: slot,
      slot,
      pooled: true,
      backend: 'container',
      owner: this.options.owner,
      createdAt: new Date().toISOString(),
      layers: [],
      labels: {},
    };
  }

  tenantState(spec: SandboxSpec, slot: string): ContainerState {
    return {
      id: spec.id,
      slot,
      backend: 'container',
      owner: this.options.owner,
      createdAt: new Date().toISOString(),
      layers: spec.layers.map((l) => l.digest),
      labels: spec.labels,
      ...(this.options.durable ? { durable: true, spec } : {}),
    };
  }

  /**
   * Launches a container in `slot` and waits for its agent: on the tenant's overlay when `overlay`
   * is given, else on the shared empty shell root.
   */
  async startContainer(
    slot: string,
    spec: SandboxSpec,
    state: ContainerState,
    options: CallOptions,
    scratch: ScratchSlot,
    overlay: { lowers: string[]; erofs: boolean } | undefined,
  ): Promise<WarmShell> {
    const paths = this.pathsOf(slot);
    const cgroup = new SandboxCgroup(this.options.layout, this.options.scope, slot, spec.qos);
    let shell: WarmShell | undefined;
    this.containersMade++;
    try {
      await this.saveState(paths.dir, state);
      const joins = await cgroup.prepare();
      const config = buildOciConfig({
        spec,
        agentHostPath: this.options.agentPath,
        cgroupsPath: `/${cgroup.relativePath}`,
        durable: this.options.durable ?? false,
        hostHasSysResource: this.options.hostHasSysResource,
        ...(overlay ? {} : { root: { path: this.shellRoot, readonly: true } }),
      });
      await writeFile(join(paths.dir, 'config.json'), JSON.stringify(config));
      await this.options.helper.launch({
        dir: paths.dir,
        joins,
        umount: this.options.layout.kind === 'v1' ? this.options.layout.unified : undefined,
        // overlay lists lower dirs top first; layers come base first
        overlay: overlay && { lowers: [...overlay.lowers].reverse(), erofs: overlay.erofs },
        runtime: this.options.runtime,
        runtimeRoot: paths.runtimeRoot,
        slot,
      });
      // the agent waits on its FIFO channel; it has no parent here to watch, so its channel
      // closing is what says it is gone
      const fifos = channelFifos(paths.dir);
      const channel = new AgentChannel(
        openPipe(fifos.requests, 'write'),
        openPipe(fifos.responses, 'read'),
        this.options.codec,
      );
      const exited = channel.closed;
      shell = {
        slot,
        qos: spec.qos,
        channel,
        cgroup,
        exited,
        limits: JSON.stringify(cgroupLimitsOf(spec.resources, spec.qos)),
        scratch,
        diskMib: spec.resources.diskMib,
      };
      this.containers.set(slot, shell);
      shell.agentState = (await this.waitReady(slot, channel, exited, paths, options)).state;
      this.options.logger.debug({ slot }, 'container ready');
      return shell;
    } catch (error) {
      if (shell) await this.teardown(shell).catch(() => undefined);
      else await removeContainerResidue(slot, cgroup, paths).catch(() => undefined);
      throw error;
    }
  }

  private async waitReady(
    slot: string,
    channel: AgentChannel,
    exited: Promise<void>,
    paths: ContainerPaths,
    options: CallOptions,
  ): Promise<AgentReady> {
    const timeoutMs = options.timeoutMs ?? this.options.startTimeoutMs ?? 30_000;
    const timeout = sleep(timeoutMs, 'timeout', { ref: false });
    const outcome = await Promise.race([
      channel.ready.then(
        () => 'ready' as const,
        () => 'exited' as const,
      ),
      exited.then(() => 'exited' as const),
      timeout,
    ]);
    if (outcome === 'ready') return channel.ready;
    const log = await readFile(join(paths.dir, 'runtime.log'), 'utf8').catch(() => '');
    const tail = log.trim().split('\n').slice(-3).join(' | ') || 'no output';
    throw new SandgymError(
      outcome === 'timeout' ? 'timeout' : 'platform_error',
      outcome === 'timeout'
        ? `Sandbox ${slot} did not become ready within ${timeoutMs} ms (raise startTimeoutMs); runtime said: ${tail}`
        : `Sandbox ${slot} failed to start: ${tail}`,
      { retryable: outcome === 'timeout' },
    );
  }

  /**
   * A new channel to the running agent of `slot`, over its FIFOs opened again: what a successor
   * adopting a durable sandbox, and a restore from a memory image, talk to it through. Whatever
   * the FIFOs still held from before is skipped up to the answer to a fresh sync marker.
   */
  async reopenChannel(slot: string, syncTimeoutMs: number): Promise<AgentChannel> {
    return this.syncChannel(slot, this.openChannel(slot), syncTimeoutMs);
  }

  /** Opens the node's ends of `slot`'s channel FIFOs again; {@link syncChannel} before use. */
  openChannel(slot: string): AgentChannel {
    const fifos = channelFifos(this.pathsOf(slot).dir);
    return new AgentChannel(
      openPipe(fifos.requests, 'write'),
      openPipe(fifos.responses, 'read'),
      this.options.codec,
      { resyncMarker: randomBytes(16), firstId: 1 + randomInt(1 << 30) },
    );
  }

  /** Skips what a reopened channel still held from before, up to the answer to its sync marker. */
  async syncChannel(slot: string, channel: AgentChannel, syncTimeoutMs: number): Promise<AgentChannel> {
    try {
      await channel.sync(syncTimeoutMs);
      return channel;
    } catch (error) {
      channel.fail(new SandgymError('agent_crash', `The agent of ${slot} did not answer on its channel`));
      throw error;
    }
  }

  /** Graceful first: the agent ends every process and exits; then force. */
  async teardown(shell: WarmShell): Promise<void> {
    try {
      await this.options.egress.detach(shell.slot).catch((error: unknown) => {
        this.options.logger.warn(
          { slot: shell.slot, error: messageOf(error) },
          'cannot take a container off the network',
        );
      });
      await shell.cgroup.setFrozen(false).catch(() => undefined); // a frozen agent cannot exit
      await shell.channel.shutdown(2_000);
      shell.channel.fail(
        new SandgymError('failed_precondition', `Sandbox container ${shell.slot} is closed`),
      );
      const graceMs = this.options.stopGraceMs ?? 5_000;
      const exited = await Promise.race([
        shell.exited.then(() => true),
        sleep(graceMs, false, { ref: false }),
      ]);
      if (!exited)
        this.options.logger.warn({ slot: shell.slot }, 'container did not stop in time; killing it');
      await removeContainerResidue(shell.slot, shell.cgroup, this.pathsOf(shell.slot));
    } finally {
      this.containers.delete(shell.slot);
    }
  }
}
