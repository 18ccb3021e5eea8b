import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomInt } from 'node:crypto';
import { existsSync, openSync, closeSync } from 'node:fs';
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  SandgymError,
  createMsgpackCodec,
  messageOf,
  definedFields,
  settleAll,
  silentLogger,
  type Codec,
  type Logger,
} from '../../common/index.ts';
import type {
  Backend,
  BackendCapabilities,
  BackendSandbox,
  LayerImage,
  CallOptions,
  GcReport,
  LayerVerification,
  LoadMode,
  SandboxRecord,
  SandboxSpec,
} from '../contract.ts';
import {
  SandboxCgroup,
  detectCgroupLayout,
  listSandboxCgroups,
  removeIdleParents,
  cgroupScope,
  type CgroupLayout,
} from '../host/cgroups.ts';
import { LayerMounts } from '../host/layer-mounts.ts';
import { LayerTarballs } from '../host/layer-tarballs.ts';
import { agentBinaryPath, hostProgram } from '../host/paths.ts';
import { isAlive, processIdentity, signalProcess, type ProcessIdentity } from '../host/processes.ts';
import { runProgram } from '../host/run-program.ts';
import { AgentChannel } from '../internal/agent-channel.ts';
import { channelFifos, createChannelFifos, openPipe } from '../internal/channel-fifos.ts';
import { ContainerSandbox } from './container-sandbox.ts';
import { buildOciConfig } from './oci-config.ts';
import { removeContainerResidue, type ContainerPaths } from './residue.ts';
import { readContainerState, writeContainerState, type ContainerState } from './sandbox-record.ts';

/** Options for {@link ContainerBackend.create}. */
export interface ContainerBackendOptions {
  /** The node's data folder: sandboxes, layer mounts and runtime state live below it. */
  dataDir: string;
  logger?: Logger;
  codec?: Codec;
  /** How long a sandbox may take to report ready. */
  startTimeoutMs?: number;
  /** How long a closing sandbox gets to exit before it is killed. */
  stopGraceMs?: number;
  /** How layers reach this node; default `ondemand`. */
  loadMode?: LoadMode;
  /** What is checked before mounting a layer; default `digest`. */
  verifyLayers?: LayerVerification;
  /**
   * Sandboxes outlive this process (a node agent): after a crash, the next process on the same
   * data dir adopts them with {@link ContainerBackend.adopt}. Otherwise they end with their owner.
   */
  durable?: boolean;
}

/** How long a reopened channel may take to answer its sync before the sandbox counts as lost. */
const ADOPT_SYNC_TIMEOUT_MS = 3_000;

const CAPABILITIES: BackendCapabilities = {
  pause: true,
  hibernate: true,
  checkpoint: 'disk',
  fork: false,
  shellSessions: false,
  ownNetwork: true,
};

/**
 * Containers launched by crun: the agent as pid 1 on an overlay of shared EROFS layer mounts,
 * in new pid, mount, network, ipc, uts and cgroup namespaces, with cgroup limits, dropped
 * capabilities and a seccomp filter.
 */
export class ContainerBackend implements Backend {
  readonly name = 'container' as const;
  readonly capabilities = CAPABILITIES;
  private readonly live = new Set<ContainerSandbox>();
  private readonly logger: Logger;
  private readonly codec: Codec;
  private isClosed = false;
  private readonly scope: string;

  private constructor(
    private readonly options: ContainerBackendOptions,
    private readonly layout: CgroupLayout,
    private readonly owner: ProcessIdentity,
    private readonly agentPath: string,
    private readonly runtime: string,
    private readonly mounts: LayerMounts,
    private readonly tarballs: LayerTarballs,
  ) {
    this.logger = (options.logger ?? silentLogger()).child({ component: 'container-backend' });
    this.codec = options.codec ?? createMsgpackCodec();
    this.scope = cgroupScope(options.dataDir);
  }

  /** Checks the host (agent binary, crun, cgroups) and prepares the data folder. */
  static async create(given: ContainerBackendOptions): Promise<ContainerBackend> {
    const options = { ...given, dataDir: resolve(given.dataDir) };
    if (process.getuid?.() !== 0) {
      throw new SandgymError('permission_denied', 'The container backend needs root: run sandgym as root');
    }
    const agentPath = agentBinaryPath();
    const runtime = hostProgram('crun');
    const layout = await detectCgroupLayout();
    const owner = await processIdentity(process.pid);
    if (!owner) throw new SandgymError('platform_error', "Cannot read this process's identity from /proc");
    await Promise.all(
      ['sandboxes', 'layers', 'runtime'].map((d) => mkdir(join(options.dataDir, d), { recursive: true })),
    );
    const mode = options.loadMode ?? 'ondemand';
    const mounts = new LayerMounts(join(options.dataDir, 'layers'), agentPath, {
      mode: mode === 'eager' ? 'eager' : 'ondemand',
      verify: options.verifyLayers ?? 'digest',
      copiesDir: join(options.dataDir, 'layer-copies'),
    });
    return new ContainerBackend(
      options,
      layout,
      owner,
      agentPath,
      runtime,
      mounts,
      new LayerTarballs(mounts),
    );
  }

  private pathsOf(id: string): ContainerPaths {
    return {
      dir: join(this.options.dataDir, 'sandboxes', id),
      runtimeRoot: join(this.options.dataDir, 'runtime'),
      runtime: this.runtime,
    };
  }

  async create(spec: SandboxSpec, options: CallOptions = {}): Promise<ContainerSandbox> {
    if (this.isClosed) throw new SandgymError('failed_precondition', 'The container backend is closed');
    if (spec.layers.length === 0) {
      throw new SandgymError('invalid_argument', 'A container needs at least one layer: name an environment');
    }
    const paths = this.pathsOf(spec.id);
    const cgroup = new SandboxCgroup(this.layout, this.scope, spec.id);
    let launcher: ChildProcess | undefined;
    try {
      await Promise.all(
        ['upper', 'work', 'rootfs'].map((d) => mkdir(join(paths.dir, d), { recursive: true })),
      );
      const state: ContainerState = {
        id: spec.id,
        backend: 'container',
        owner: this.owner,
        createdAt: new Date().toISOString(),
        layers: spec.layers.map((l) => l.digest),
        labels: spec.labels,
        ...(this.options.durable ? { durable: true, spec } : {}),
      };
      await writeContainerState(paths.dir, state);
      const unpacked = this.options.loadMode === 'tar';
      const points = unpacked
        ? await this.tarballs.unpack(spec.layers, paths.dir)
        : await this.mounts.acquire(spec.layers);
      const joins = await cgroup.prepare();
      const config = buildOciConfig({
        spec,
        agentHostPath: this.agentPath,
        cgroupsPath: `/${cgroup.relativePath}`,
        durable: this.options.durable ?? false,
      });
      await writeFile(join(paths.dir, 'config.json'), JSON.stringify(config));
      const launched = await this.launch(spec.id, paths, points, joins, !unpacked);
      launcher = launched.launcher;
      // so that gc can stop a launcher whose owner died before the sandbox was up
      const launcherIdentity = await processIdentity(launcher.pid ?? -1);
      if (launcherIdentity) await writeContainerState(paths.dir, { ...state, launcher: launcherIdentity });
      const channel = new AgentChannel(launched.requests, launched.responses, this.codec);
      const started = launcher;
      const sandbox = new ContainerSandbox({
        spec,
        exited: new Promise((resolve) => {
          if (started.exitCode !== null || started.signalCode !== null) return resolve();
          started.once('exit', () => resolve());
        }),
        channel,
        cgroup,
        upperDir: join(paths.dir, 'upper'),
        destroy: (s) => this.destroy(s),
      });
      this.live.add(sandbox);
      await this.waitReady(spec.id, channel, sandbox, paths, options);
      this.logger.debug({ id: spec.id }, 'sandbox ready');
      return sandbox;
    } catch (error) {
      const live = [...this.live].find((s) => s.id === spec.id);
      if (live) await live.close().catch(() => undefined);
      else {
        if (launcher) signalProcess(launcher.pid ?? 0, 'SIGKILL');
        await removeContainerResidue(spec.id, cgroup, paths).catch(() => undefined);
        if (this.options.loadMode !== 'tar') this.mounts.release(spec.layers);
      }
      throw error;
    }
  }

  private async launch(
    id: string,
    paths: ContainerPaths,
    points: string[],
    joins: string[],
    erofs: boolean,
  ): Promise<{ launcher: ChildProcess; requests: Writable; responses: Readable }> {
    const args = ['launch'];
    for (const file of joins) args.push('--join-cgroup', file);
    if (erofs) args.push('--lowers-are-erofs');
    // overlay lists lower dirs top first; layers come base first
    const lowers = [...points].reverse().join(':');
    args.push(
      '--overlay',
      lowers,
      join(paths.dir, 'upper'),
      join(paths.dir, 'work'),
      join(paths.dir, 'rootfs'),
    );
    if (this.layout.kind === 'v1' && this.layout.unified) args.push('--umount', this.layout.unified);
    args.push(
      '--',
      this.runtime,
      '--root',
      paths.runtimeRoot,
      'run',
      '--detach',
      '--preserve-fds',
      '2',
      '--bundle',
      paths.dir,
      id,
    );
    // the channel is fds 3 and 4: a socketpair that dies with this process, or, for a durable
    // sandbox, a FIFO pair a successor can reopen
    const durable = this.options.durable ? await createChannelFifos(paths.dir) : undefined;
    const log = openSync(join(paths.dir, 'runtime.log'), 'a');
    try {
      // detached: a Ctrl-C meant for the CLI must not reach the sandbox before the CLI tears it down
      // stdio carries only the runtime's and the agent's own messages
      const launcher = spawn(this.agentPath, args, {
        stdio: ['ignore', log, log, ...(durable ? durable.agentEnds : (['pipe', 'pipe'] as const))],
        detached: true,
      });
      if (durable) return { launcher, requests: durable.requests, responses: durable.responses };
      const [, , , requests, responses] = launcher.stdio as [unknown, unknown, unknown, Writable, Readable];
      return { launcher, requests, responses };
    } finally {
      closeSync(log);
      durable?.closeAgentEnds();
    }
  }

  private async waitReady(
    id: string,
    channel: AgentChannel,
    sandbox: ContainerSandbox,
    paths: ContainerPaths,
    options: CallOptions,
  ): Promise<void> {
    const timeoutMs = options.timeoutMs ?? this.options.startTimeoutMs ?? 30_000;
    const timeout = sleep(timeoutMs, 'timeout', { ref: false });
    const outcome = await Promise.race([
      channel.ready.then(
        () => 'ready' as const,
        () => 'exited' as const,
      ),
      sandbox.launcherExited.then(() => 'exited' as const),
      timeout,
    ]);
    if (outcome === 'ready') return;
    const log = await readFile(join(paths.dir, 'runtime.log'), 'utf8').catch(() => '');
    const tail = log.trim().split('\n').slice(-3).join(' | ') || 'no output';
    throw new SandgymError(
      outcome === 'timeout' ? 'timeout' : 'platform_error',
      outcome === 'timeout'
        ? `Sandbox ${id} did not become ready within ${timeoutMs} ms (raise startTimeoutMs); runtime said: ${tail}`
        : `Sandbox ${id} failed to start: ${tail}`,
      { retryable: outcome === 'timeout' },
    );
  }

  /** Graceful first: closing the channel makes the agent end every process and exit; then force. */
  private async destroy(sandbox: ContainerSandbox): Promise<void> {
    if (!sandbox.beginStop()) return;
    const cgroup = new SandboxCgroup(this.layout, this.scope, sandbox.id);
    const errors: unknown[] = [];
    try {
      await cgroup.setFrozen(false).catch(() => undefined); // a frozen agent cannot exit
      await sandbox.disconnect();
      const graceMs = this.options.stopGraceMs ?? 5_000;
      const exited = await Promise.race([
        sandbox.launcherExited.then(() => true),
        sleep(graceMs, false, { ref: false }),
      ]);
      if (!exited) this.logger.warn({ id: sandbox.id }, 'sandbox did not stop in time; killing it');
      await removeContainerResidue(sandbox.id, cgroup, this.pathsOf(sandbox.id));
    } catch (error) {
      errors.push(error);
    } finally {
      if (this.options.loadMode !== 'tar') this.mounts.release(sandbox.layers);
      this.live.delete(sandbox);
      sandbox.markStopped();
    }
    if (errors.length) throw errors[0];
  }

  async list(): Promise<SandboxRecord[]> {
    const dir = join(this.options.dataDir, 'sandboxes');
    const records: SandboxRecord[] = [];
    for (const id of await readdir(dir).catch(() => [] as string[])) {
      const state = await readContainerState(join(dir, id));
      if (!state) continue;
      const cgroup = new SandboxCgroup(this.layout, this.scope, id);
      const alive = await isAlive(state.owner);
      records.push({
        id,
        backend: 'container',
        state: !alive ? 'orphaned' : (await cgroup.isFrozen()) ? 'paused' : 'running',
        ownerPid: state.owner.pid,
        createdAt: state.createdAt,
        labels: state.labels,
        layers: state.layers,
      });
    }
    return records;
  }

  /** The sandboxes this process holds. */
  liveSandboxes(): ContainerSandbox[] {
    return [...this.live];
  }

  attach(id: string): ContainerSandbox {
    const mine = [...this.live].find((s) => s.id === id);
    if (!mine)
      throw new SandgymError('not_found', `No live sandbox "${id}" of this process: see "sandgym ps"`);
    return mine;
  }

  async kill(id: string): Promise<void> {
    const mine = [...this.live].find((s) => s.id === id);
    if (mine) return mine.close();
    const paths = this.pathsOf(id);
    const cgroup = new SandboxCgroup(this.layout, this.scope, id);
    if (!existsSync(paths.dir) && (await cgroup.processes()).length === 0) {
      throw new SandgymError('not_found', `No sandbox "${id}" on this node: see "sandgym ps"`);
    }
    await removeContainerResidue(id, cgroup, paths);
  }

  /**
   * Takes over the durable sandboxes a dead predecessor on this data dir left running: reopens
   * each agent's channel (two FIFOs in the sandbox's folder), resynchronises it, and makes this
   * process the owner. A sandbox whose channel does not resynchronise is left for gc.
   */
  async adopt(): Promise<ContainerSandbox[]> {
    const adopted: ContainerSandbox[] = [];
    const sandboxesDir = join(this.options.dataDir, 'sandboxes');
    const mine = new Set([...this.live].map((s) => s.id));
    for (const id of await readdir(sandboxesDir).catch(() => [] as string[])) {
      if (mine.has(id)) continue;
      const state = await readContainerState(join(sandboxesDir, id));
      if (!state?.durable || !state.spec || (await isAlive(state.owner))) continue;
      try {
        adopted.push(await this.adoptOne(state, state.spec));
      } catch (error) {
        this.logger.warn({ id, error: messageOf(error) }, 'cannot adopt sandbox; gc will reap it');
      }
    }
    return adopted;
  }

  private async adoptOne(
    state: ContainerState,
    recorded: NonNullable<ContainerState['spec']>,
  ): Promise<ContainerSandbox> {
    const { lifetime, ...rest } = recorded;
    const spec: SandboxSpec = {
      ...rest,
      layers: recorded.layers.map((layer) => definedFields(layer) as LayerImage),
      ...(lifetime ? { lifetime: definedFields(lifetime) } : {}),
    };
    const paths = this.pathsOf(state.id);
    const cgroup = new SandboxCgroup(this.layout, this.scope, state.id);
    if ((await cgroup.processes()).length === 0) throw new Error('none of its processes is left');
    const wasFrozen = await cgroup.isFrozen();
    if (wasFrozen) await cgroup.setFrozen(false); // a frozen agent cannot answer the sync
    const fifos = channelFifos(paths.dir);
    const channel = new AgentChannel(
      openPipe(fifos.requests, 'write'),
      openPipe(fifos.responses, 'read'),
      this.codec,
      { resyncMarker: randomBytes(16), firstId: 1 + randomInt(1 << 30) },
    );
    try {
      await channel.sync(ADOPT_SYNC_TIMEOUT_MS);
    } catch (error) {
      channel.fail(new SandgymError('agent_crash', 'adoption failed'));
      if (wasFrozen) await cgroup.setFrozen(true).catch(() => undefined);
      throw error;
    }
    await this.mounts.acquire(spec.layers);
    await writeContainerState(paths.dir, { ...state, owner: this.owner });
    const sandbox = new ContainerSandbox({
      spec,
      exited: channel.closed,
      channel,
      cgroup,
      upperDir: join(paths.dir, 'upper'),
      destroy: (s) => this.destroy(s),
      createdAt: Date.parse(state.createdAt),
    });
    this.live.add(sandbox);
    if (wasFrozen) await sandbox.pause();
    this.logger.info({ id: state.id }, 'adopted sandbox');
    return sandbox;
  }

  async withWritableLayerOf<T>(
    id: string,
    consume: (dir: string, sandbox: Pick<BackendSandbox, 'layers' | 'labels'>) => Promise<T>,
  ): Promise<T> {
    const mine = [...this.live].find((s) => s.id === id);
    if (mine) return mine.withWritableLayer((dir) => consume(dir, mine));
    const paths = this.pathsOf(id);
    const state = await readContainerState(paths.dir);
    if (!state) throw new SandgymError('not_found', `No sandbox "${id}" on this node: see "sandgym ps"`);
    const cgroup = new SandboxCgroup(this.layout, this.scope, id);
    const wasFrozen = await cgroup.isFrozen();
    // frozen, so what it writes cannot change under the packer
    if (!wasFrozen) await cgroup.setFrozen(true);
    try {
      // paths are left empty: the consumer reads digests, it does not mount
      const layers: LayerImage[] = state.layers.map((digest) => ({ digest, path: '' }));
      return await consume(join(paths.dir, 'upper'), { layers, labels: state.labels });
    } finally {
      if (!wasFrozen) await cgroup.setFrozen(false);
    }
  }

  async gc(): Promise<GcReport> {
    const report: GcReport = { sandboxes: [], mounts: [], cgroups: [] };
    const sandboxesDir = join(this.options.dataDir, 'sandboxes');
    const mine = new Set([...this.live].map((s) => s.id));
    for (const id of await readdir(sandboxesDir).catch(() => [] as string[])) {
      if (mine.has(id)) continue;
      const state = await readContainerState(join(sandboxesDir, id));
      if (state && (await isAlive(state.owner))) continue;
      await removeContainerResidue(id, new SandboxCgroup(this.layout, this.scope, id), this.pathsOf(id));
      report.sandboxes.push(id);
    }
    // cgroups whose sandbox folder is gone: a crash between the two removals
    for (const id of await listSandboxCgroups(this.layout, this.scope)) {
      if (mine.has(id) || existsSync(join(sandboxesDir, id))) continue;
      const cgroup = new SandboxCgroup(this.layout, this.scope, id);
      await removeContainerResidue(id, cgroup, this.pathsOf(id));
      report.cgroups.push(...cgroup.allPaths());
    }
    await this.removeOrphanRuntimeState(mine);
    if (mine.size === 0) await removeIdleParents(this.layout, this.scope);
    report.mounts = await this.mounts.unmountIdle();
    return report;
  }

  async gcLayers(): Promise<{ unmounted: string[]; removedCopies: string[] }> {
    const unmounted = await this.mounts.unmountIdle();
    return { unmounted, removedCopies: await this.mounts.removeIdleCopies() };
  }

  private async removeOrphanRuntimeState(mine: Set<string>): Promise<void> {
    const root = join(this.options.dataDir, 'runtime');
    for (const id of await readdir(root).catch(() => [] as string[])) {
      if (mine.has(id) || existsSync(this.pathsOf(id).dir)) continue;
      await runProgram(this.runtime, ['--root', root, 'delete', '--force', id]).catch((error: unknown) => {
        this.logger.warn({ id, error: messageOf(error) }, 'cannot delete orphaned runtime state');
      });
    }
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    const closing = settleAll(
      [...this.live].map((s) => s.close()),
      'Some sandboxes did not close cleanly',
    );
    await closing.catch(() => undefined); // wait for every sandbox before the node-level cleanup
    await this.mounts.unmountIdle().catch(() => undefined);
    await removeIdleParents(this.layout, this.scope);
    await closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
