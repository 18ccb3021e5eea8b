import { SandgymError, messageOf, type FailureReason } from '../../common/index.ts';
import {
  type CallOptions,
  type CheckpointOptions,
  type HibernateOptions,
  type HibernateReport,
  type NetworkRecord,
  type SandboxCheckpoint,
  type SandboxSpec,
  type SandboxStats,
  type StepCounters,
  type WritableLayerOptions,
  type WrittenPathsOptions,
} from '../contract.ts';
import { NOTHING_FILTERED, consumeFiltered, type PrivateCopy } from './private-copy.ts';
import type { FilterReport } from '../host/diff-filter.ts';
import type { SandboxCgroup, UsageBaseline } from '../host/cgroups.ts';
import { deniedEgressNow, deniedEgressOf } from '../host/egress.ts';
import type { ScratchUsage } from '../host/scratch-volume.ts';
import { activeSwapAreas, stillActive, type SwapArea } from '../host/swap.ts';
import { writtenUnder } from '../host/written-paths.ts';
import type { AgentChannel } from '../internal/agent-channel.ts';
import { AgentSandbox } from '../internal/agent-sandbox.ts';
import { CheckpointShelf } from '../internal/checkpoint-shelf.ts';
import { throwIfAborted } from '../internal/checks.ts';
import type { MemoryImage } from './memory-image.ts';

/** How long a thawed agent may take to show it is alive. */
const RESUME_CHECK_MS = 5_000;

/** What a container sandbox needs from its backend. */
export interface ContainerSandboxParts {
  spec: SandboxSpec;
  /** Its container's slot (see ContainerBackend). */
  slot: string;
  /** Counters the container ran up before this tenant (a warm sandbox), left out of its stats. */
  baseline?: UsageBaseline;
  /** Resolves when the sandbox's processes are gone (the runtime exited, or the agent's channel closed). */
  exited: Promise<void>;
  channel: AgentChannel;
  cgroup: SandboxCgroup;
  /** The overlay upper dir on the node. */
  upperDir: string;
  /** What it has written and may write, from its slot's quota group. */
  diskUsage: () => Promise<ScratchUsage | undefined>;
  /** What it has written, in bytes, read synchronously; undefined if unknown. */
  diskUsedNow: () => number | undefined;
  /** Its network: rules replaced, and the connections they refused. */
  network: {
    set(rules: readonly string[]): Promise<void>;
    denied(): Promise<number>;
    /** What it was refused since its rules were last set; undefined when it is loopback only. */
    record(): Promise<NetworkRecord | undefined>;
    /** Whether it is on the node network (so its rules keep a counter). */
    attached(): boolean;
  };
  /** Tears the sandbox down; called once, by close(). */
  destroy(sandbox: ContainerSandbox): Promise<void>;
  /** When it was created (ms since the epoch); now, unless it is being adopted. */
  createdAt?: number;
  /** A private copy of what it wrote (a snapshot of its writable subvolume), for pruning and packing. */
  privateCopy(upperDir: string): Promise<PrivateCopy>;
  /** Its processes and memory to and from disk (CRIU), where the host and the container allow it. */
  memory?: ContainerMemory;
  /** Set when it starts out hibernated (adopted so): its processes are in this image. */
  hibernatedImage?: MemoryImage;
  /** The barrier before it hibernates to a memory image (see ContainerBackendOptions.beforeImage). */
  beforeImage?: (sandboxId: string) => Promise<void>;
}

/**
 * A container's processes and memory dumped to disk and started again (CRIU): what its
 * hibernation and memory checkpoints are made of.
 */
export interface ContainerMemory {
  /** Whether its processes can be dumped now (not while it is on the node's network). */
  available(): boolean;
  /** Why not, when it is not {@link available}: what to use instead. */
  unavailableBecause(): string;
  /** Dumps its processes, which are gone afterwards: hibernation. */
  dump(): Promise<MemoryImage>;
  /** Starts `image`'s processes as the container's, and a channel to their agent. */
  restore(image: MemoryImage): Promise<AgentProcess>;
  /** Starts a {@link restore} of `image` that waits for its turn next: a request waits on it. */
  hurry(image: MemoryImage): void;
  /** Deletes an image's files. */
  drop(image: MemoryImage): Promise<void>;
  /** Dumps its processes, which carry on, with a copy of its files taken at the same instant. */
  checkpoint(): Promise<ContainerCheckpoint>;
  /** Ends its processes and puts a checkpoint's processes and files in their place. */
  restoreCheckpoint(checkpoint: ContainerCheckpoint): Promise<AgentProcess>;
  /** Deletes a checkpoint's image and files. */
  dropCheckpoint(checkpoint: ContainerCheckpoint): Promise<void>;
}

/** A container's agent process as its handle talks to it. */
export interface AgentProcess {
  channel: AgentChannel;
  exited: Promise<void>;
}

/** A memory image and the copy of the writable layer taken with it. */
export interface ContainerCheckpoint {
  image: MemoryImage;
  /** The snapshot of its writable subvolume taken with it. */
  copy: string;
  public: SandboxCheckpoint;
}

/** One live container: a handle over its agent channel and its cgroups. */
export class ContainerSandbox extends AgentSandbox {
  readonly backend = 'container' as const;
  readonly slot: string;
  private writableDir: string;
  private seenOomKills = 0;
  /** The network changes asked so far, each after the one before (see setNetwork). */
  private networkChanges: Promise<void> = Promise.resolve();
  private swapAreas: SwapArea[] = [];
  /** The channel to its agent: a restore from a memory image brings a new agent process, and channel. */
  private agent: { channel: AgentChannel; exited: Promise<void> };
  /** Counts agent processes: an exit of an earlier one (dumped on purpose) is not a crash. */
  private agentGeneration = 0;
  /** Where its processes are while it hibernates by memory image. */
  private hibernatedImage: MemoryImage | undefined;
  private resuming: Promise<void> | undefined;
  /** Its checkpoints, in its folder: they go with it. */
  readonly checkpoints: CheckpointShelf<ContainerCheckpoint>;

  constructor(private readonly parts: ContainerSandboxParts) {
    super(parts.spec, parts.createdAt);
    this.agent = { channel: parts.channel, exited: parts.exited };
    this.watchAgent();
    this.checkpoints = new CheckpointShelf(parts.spec.id, (made) =>
      parts.memory ? parts.memory.dropCheckpoint(made) : Promise.resolve(),
    );
    if (parts.hibernatedImage) {
      // no agent runs until a request restores it: the placeholder channel's end is expected
      this.agentGeneration++;
      this.hibernatedImage = parts.hibernatedImage;
      this.currentState = 'hibernated';
    }
    this.slot = parts.slot;
    this.writableDir = parts.upperDir;
    this.seenOomKills = parts.baseline?.oomKills ?? 0;
  }

  protected get channel(): AgentChannel {
    return this.agent.channel;
  }

  /** Fails the sandbox when its current agent goes away, unless that was on purpose. */
  private watchAgent(): void {
    const generation = ++this.agentGeneration;
    this.watchExit(this.agent.exited, () => generation === this.agentGeneration);
  }

  protected destroy(): Promise<void> {
    return this.parts.destroy(this);
  }

  /**
   * An agent that went away while its memory cgroup counted an OOM kill inside the sandbox's own
   * limit was ended by an OOM the sandbox caused: `oom`, the sandbox's doing, not the platform's.
   */
  protected override async causeOfExit(): Promise<FailureReason> {
    const usage = await this.parts.cgroup.usage();
    const baseline = this.parts.baseline;
    const killed = usage.oomKills > (baseline?.oomKills ?? 0);
    const hitLimit = usage.memoryLimitHits > (baseline?.memoryLimitHits ?? 0);
    return killed && hitLimit ? 'oom' : 'agent_crash';
  }

  /** The memory cgroup's OOM counter. */
  protected async oomKilledSinceLastCheck(): Promise<boolean> {
    const { oomKills } = await this.parts.cgroup.usage();
    const killed = oomKills > this.seenOomKills;
    this.seenOomKills = oomKills;
    return killed;
  }

  get cgroup(): SandboxCgroup {
    return this.parts.cgroup;
  }

  /** Its agent's process state as its last command left it alone in the sandbox, if it did. */
  get agentStateWhenLastAlone(): string | undefined {
    return this.agentStateAfterLastCommand;
  }

  /** Its overlay upper dir on the node: what it has written. */
  get upperDir(): string {
    return this.writableDir;
  }

  /** Its backend gave it a fresh root with this upper dir (see ContainerBackend.renewRoot). */
  rebase(upperDir: string): void {
    this.writableDir = upperDir;
  }

  async pause(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Pause');
    if (this.currentState === 'paused') return;
    await this.ready('pause', undefined);
    await this.parts.cgroup.setFrozen(true);
    this.currentState = 'paused';
  }

  /**
   * With CRIU and an idle sandbox, its processes are dumped to disk and end, so all of its memory
   * is freed, kernel memory included; the next request starts them again. Otherwise it is frozen
   * and its memory reclaimed (page cache dropped, anonymous memory to swap where there is swap).
   * When neither freed its processes' memory, it is only paused, and the report says so and why.
   */
  async hibernate(options: HibernateOptions = {}): Promise<HibernateReport> {
    throwIfAborted(options.signal, 'Hibernate');
    if (this.currentState === 'hibernated')
      return { state: 'hibernated', freedBytes: 0, residentBytes: await this.residentBytes() };
    const memory = this.parts.memory;
    let noImage: string;
    if (options.keepProcesses) noImage = 'its processes were kept, as asked (a short preemption)';
    else if (!memory) noImage = 'this host has no CRIU 4.1, or the warm pool started it';
    else if (!memory.available()) noImage = memory.unavailableBecause();
    else if (this.activeCalls > 0) noImage = 'a request was in flight';
    else {
      try {
        return await this.hibernateToImage(memory);
      } catch (error) {
        // the backend logged it; the processes still run, so reclaim instead
        noImage = messageOf(error);
      }
    }
    return this.hibernateByReclaim(noImage);
  }

  /** Frozen, its memory pushed out as far as the node lets it: to swap, where there is swap. */
  private async hibernateByReclaim(noImage: string): Promise<HibernateReport> {
    await this.pause();
    const freedBytes = await this.parts.cgroup.reclaim();
    const swappedBytes = await this.parts.cgroup.swappedBytes();
    const residentBytes = await this.residentBytes();
    const swapAreas = await activeSwapAreas();
    if (swappedBytes === 0) {
      // page cache at most: its processes' memory is all still in the node's memory
      const noSwap = swapAreas.length === 0 ? 'the node has no swap' : 'swap took none of it';
      return {
        state: 'paused',
        freedBytes,
        swappedBytes,
        residentBytes,
        reason: `its memory stays resident: it was not dumped (${noImage}), and ${noSwap}`,
      };
    }
    // the swap areas its memory went to: it can only come back whole while they stay
    this.swapAreas = swapAreas;
    this.currentState = 'hibernated';
    return { state: 'hibernated', freedBytes, swappedBytes, residentBytes };
  }

  private async residentBytes(): Promise<number> {
    return (await this.parts.cgroup.usage()).memoryBytes;
  }

  /** Dumps its processes to an image in its folder; they end, and the cgroup's memory goes with them. */
  private async hibernateToImage(memory: ContainerMemory): Promise<HibernateReport> {
    // first, while nothing has changed: a failed barrier leaves the sandbox as it was
    await this.parts.beforeImage?.(this.id);
    const before = await this.residentBytes();
    const wasPaused = this.currentState === 'paused';
    // CRIU stops the processes itself; a frozen cgroup would hold it off
    if (wasPaused) await this.parts.cgroup.setFrozen(false);
    const previous = this.agent;
    this.agentGeneration++; // the dumped agent's exit is expected
    let image: MemoryImage;
    try {
      image = await memory.dump();
    } catch (error) {
      this.agent = previous;
      this.watchAgent();
      if (wasPaused) await this.parts.cgroup.setFrozen(true);
      throw error;
    }
    previous.channel.fail(new SandgymError('failed_precondition', `Sandbox ${this.id} hibernated`));
    this.hibernatedImage = image;
    this.currentState = 'hibernated';
    // what its files left in the page cache, charged to it, goes too
    await this.parts.cgroup.reclaim();
    const after = await this.residentBytes();
    return {
      state: 'hibernated',
      freedBytes: Math.max(0, before - after),
      residentBytes: after,
      imageBytes: image.sizeBytes,
    };
  }

  async resume(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Resume');
    if (this.currentState === 'hibernated') {
      // one comeback at a time: a request may come while a phase change brings it back; a
      // request waiting on a restore the phase change queued with the run's others goes first
      if (this.resuming && this.hibernatedImage) this.parts.memory?.hurry(this.hibernatedImage);
      this.resuming ??= (this.hibernatedImage ? this.resumeFromImage() : this.thawFromSwap()).finally(
        () => (this.resuming = undefined),
      );
      return this.resuming;
    }
    if (this.currentState !== 'paused') return;
    await this.parts.cgroup.setFrozen(false);
    this.currentState = 'running';
  }

  /** Thaws it after a hibernation by reclaim, and checks it came back whole. */
  private async thawFromSwap(): Promise<void> {
    await this.parts.cgroup.setFrozen(false);
    this.currentState = 'running';
    await this.checkWholeAfterHibernation();
  }

  /**
   * Saves its processes, memory and files (CRIU); it carries on. Containers that CRIU cannot
   * stand up again (on the node network, started by the warm pool, or on a host without CRIU 4.1)
   * fail `unsupported`; their files can still become an environment (`platform.packDiff`).
   */
  async checkpoint(options: CheckpointOptions = {}): Promise<SandboxCheckpoint> {
    await this.ready('checkpoint', options.signal);
    const memory = this.parts.memory;
    if (!memory?.available()) {
      const why = memory
        ? memory.unavailableBecause()
        : 'this host has no CRIU 4.1 (`sandgym setup --criu` builds it), or the warm pool started it';
      throw new SandgymError(
        'unsupported',
        `Sandbox ${this.id} cannot be checkpointed at memory depth: ${why}. Its files can be: platform.packDiff(sandbox, { name })`,
      );
    }
    if (this.activeCalls > 0)
      throw new SandgymError(
        'failed_precondition',
        `Sandbox ${this.id} has a request in flight: checkpoint it when idle`,
      );
    const made = await memory.checkpoint();
    await this.checkpoints.add(made.public.id, made);
    return made.public;
  }

  /** Ends its processes and starts a checkpoint's in their place, on the checkpoint's files. */
  async restore(checkpoint: SandboxCheckpoint | string, options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Restore');
    const made = this.checkpoints.get(checkpoint);
    const memory = this.parts.memory;
    if (!memory) return; // no checkpoint was made without it: get() threw
    this.agentGeneration++; // its current agent is ended on purpose
    const previous = this.agent;
    try {
      this.agent = await memory.restoreCheckpoint(made);
    } catch (error) {
      return this.lose(`its checkpoint could not be restored: ${messageOf(error)}`);
    }
    previous.channel.fail(new SandgymError('failed_precondition', `Sandbox ${this.id} was restored`));
    this.watchAgent();
    const hibernated = this.hibernatedImage;
    this.hibernatedImage = undefined;
    this.currentState = 'running';
    if (hibernated) await memory.drop(hibernated);
  }

  /** Starts the processes of its hibernation image again: the same processes, memory and files. */
  private async resumeFromImage(): Promise<void> {
    const image = this.hibernatedImage;
    const memory = this.parts.memory;
    if (!image || !memory) return;
    try {
      this.agent = await memory.restore(image);
    } catch (error) {
      return this.lose(`its processes could not be restored: ${messageOf(error)}`);
    }
    this.watchAgent();
    this.hibernatedImage = undefined;
    this.currentState = 'running';
    // its files go after the request that waits: nothing reads them again, and no record names them
    void memory.drop(image).catch(() => undefined);
  }

  /**
   * A hibernated sandbox whose memory was on a swap area that is gone, or whose agent did not
   * survive the thaw (a swap read error kills the process that faults), is lost: it fails as
   * `node_lost` rather than carry on silently broken.
   */
  private async checkWholeAfterHibernation(): Promise<void> {
    const areas = this.swapAreas;
    this.swapAreas = [];
    const now = areas.length ? await activeSwapAreas() : [];
    const gone = areas.filter((area) => !stillActive(area, now)).map((area) => area.filename);
    if (gone.length) return this.lose(`its memory was on swap ${gone.join(', ')}, which is gone`);
    const alive = await this.channel.call({ op: 'ping' }, { timeoutMs: RESUME_CHECK_MS }).then(
      () => true,
      () => false,
    );
    if (!alive) return this.lose('its agent did not survive the thaw');
  }

  private lose(why: string): never {
    const error = new SandgymError(
      'node_lost',
      `Sandbox ${this.id} came back from hibernation broken: ${why}`,
    );
    this.currentState = 'failed';
    this.failureReason = 'node_lost';
    this.channel.fail(error);
    throw error;
  }

  async stats(options: CallOptions = {}): Promise<SandboxStats> {
    throwIfAborted(options.signal, 'Stats');
    const [measured, pids, disk, deniedByRules, network] = await Promise.all([
      this.parts.cgroup.usage(),
      this.parts.cgroup.processes(),
      this.parts.diskUsage(),
      this.parts.network.denied(),
      this.parts.network.record(),
    ]);
    const usage = {
      ...measured,
      cpuUsageMs: measured.cpuUsageMs - (this.parts.baseline?.cpuUsageMs ?? 0),
      oomKills: measured.oomKills - (this.parts.baseline?.oomKills ?? 0),
      pidsLimitHits: measured.pidsLimitHits - (this.parts.baseline?.pidsLimitHits ?? 0),
    };
    let deniedEgress: number | undefined;
    // any process of the sandbox shows its network namespace; one may exit while it is read
    for (const pid of pids) if ((deniedEgress = await deniedEgressOf(pid)) !== undefined) break;
    return {
      state: this.currentState,
      ...usage,
      deniedEgress: (deniedEgress ?? 0) + deniedByRules,
      diskBytes: disk?.usedBytes ?? 0,
      ...(network ? { network } : {}),
    };
  }

  async stepCounters(): Promise<StepCounters> {
    const counted = this.parts.cgroup.stepCounters();
    const baseline = this.parts.baseline;
    // the rules' own counter is only there for a sandbox on the node network
    const deniedByRules = this.parts.network.attached() ? await this.parts.network.denied() : 0;
    const inNamespace = counted.anyPid === undefined ? undefined : deniedEgressNow(counted.anyPid);
    return {
      pids: counted.pids,
      oomKills: counted.oomKills - (baseline?.oomKills ?? 0),
      pidsLimitHits: counted.pidsLimitHits - (baseline?.pidsLimitHits ?? 0),
      deniedEgress: (inNamespace ?? 0) + deniedByRules,
      diskBytes: this.parts.diskUsedNow() ?? 0,
    };
  }

  async writtenPaths(prefixes: readonly string[], options: WrittenPathsOptions = {}): Promise<string[]> {
    throwIfAborted(options.signal, 'Listing written paths');
    return writtenUnder(this.writableDir, prefixes, options.limit ?? 256);
  }

  async setNetwork(rules: readonly string[], options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Setting the network rules');
    if (
      this.currentState === 'stopping' ||
      this.currentState === 'stopped' ||
      this.currentState === 'failed'
    ) {
      throw new SandgymError('failed_precondition', `Sandbox ${this.id} is ${this.currentState}`);
    }
    this.active = Date.now();
    // one change at a time, in the order asked: two overlapping changes whose nft transactions
    // committed out of order left the wider rules in force after the narrower were asked last
    const change = this.networkChanges.then(() => this.parts.network.set(rules));
    this.networkChanges = change.catch(() => undefined);
    await change;
  }

  async withWritableLayer<T>(
    consume: (dir: string, report: FilterReport) => Promise<T>,
    options: WritableLayerOptions = {},
  ): Promise<T> {
    throwIfAborted(options.signal, 'Reading the writable layer');
    const { filter } = options;
    if (!filter) return this.whileStill(() => consume(this.writableDir, NOTHING_FILTERED));
    // frozen only while the copy is taken: the sandbox runs on while the copy is pruned and packed
    const copy = await this.whileStill(() => this.parts.privateCopy(this.writableDir));
    return consumeFiltered(copy, filter, this.resources.diskMib, consume);
  }

  /**
   * Runs `work` while nothing in the sandbox runs: frozen, and thawed after unless it was paused
   * before. A sandbox whose agent died has nothing left to run; its layer is still there to read.
   */
  private async whileStill<T>(work: () => Promise<T>): Promise<T> {
    if (this.currentState === 'failed') return work();
    const wasPaused = this.currentState === 'paused';
    await this.ready('read the writable layer', undefined);
    await this.pause();
    try {
      return await work();
    } finally {
      if (!wasPaused) await this.resume();
    }
  }
}
