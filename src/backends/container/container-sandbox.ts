import { constants } from 'node:os';
import { SandgymError, type FailureReason } from '../../common/index.ts';
import type {
  BackendSandbox,
  CallOptions,
  DirEntry,
  ExecChunk,
  ExecOptions,
  ExecResult,
  ExecStream,
  HibernateReport,
  LayerImage,
  ReadFileOptions,
  SandboxResources,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  WriteFileOptions,
  WrittenPathsOptions,
} from '../contract.ts';
import type { SandboxCgroup, UsageBaseline } from '../host/cgroups.ts';
import type { AgentChannel } from '../internal/agent-channel.ts';
import type { AgentExit } from '../internal/agent-protocol.ts';
import { AsyncQueue } from '../../common/index.ts';
import { callOptionsOf } from '../call-options.ts';
import { collectExec } from '../collect-exec.ts';
import { deniedEgressOf } from '../host/egress.ts';
import type { ScratchUsage } from '../host/scratch-volume.ts';
import { writtenUnder } from '../host/written-paths.ts';
import { activeSwapAreas, stillActive, type SwapArea } from '../host/swap.ts';
import { checkArgv, checkSandboxPath, throwIfAborted } from '../internal/checks.ts';
import { resolveUser, type ResolvedUser } from '../internal/users.ts';

/** How long a thawed agent may take to show it is alive. */
const RESUME_CHECK_MS = 5_000;

const SIGNAL_NAMES = new Map<number, string>(
  Object.entries(constants.signals).map(([name, number]) => [number, name]),
);

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
  /** Its network: rules replaced, and the connections they refused. */
  network: {
    set(rules: readonly string[]): Promise<void>;
    denied(): Promise<number>;
  };
  /** Tears the sandbox down; called once, by close(). */
  destroy(sandbox: ContainerSandbox): Promise<void>;
  /** When it was created (ms since the epoch); now, unless it is being adopted. */
  createdAt?: number;
}

/** One live container: a handle over its agent channel and its cgroups. */
export class ContainerSandbox implements BackendSandbox {
  readonly backend = 'container' as const;
  readonly id: string;
  readonly slot: string;
  private writableDir: string;
  private currentState: SandboxState = 'running';
  private failureReason: FailureReason | undefined;
  private seenOomKills = 0;
  private swapAreas: SwapArea[] = [];
  private active = Date.now();
  readonly createdAt: number;
  private closing: Promise<void> | undefined;
  private readonly exited: Promise<void>;

  constructor(private readonly parts: ContainerSandboxParts) {
    this.id = parts.spec.id;
    this.slot = parts.slot;
    this.writableDir = parts.upperDir;
    this.seenOomKills = parts.baseline?.oomKills ?? 0;
    this.createdAt = parts.createdAt ?? Date.now();
    this.exited = parts.exited;
    void this.exited.then(() => this.onLauncherExit());
  }

  get state(): SandboxState {
    return this.currentState;
  }

  get failure(): FailureReason | undefined {
    return this.failureReason;
  }

  /** Its overlay upper dir on the node: what it has written. */
  get upperDir(): string {
    return this.writableDir;
  }

  /** Its backend gave it a fresh root with this upper dir (see ContainerBackend.renewRoot). */
  rebase(upperDir: string): void {
    this.writableDir = upperDir;
  }

  get cgroup(): SandboxCgroup {
    return this.parts.cgroup;
  }

  get layers(): readonly LayerImage[] {
    return this.parts.spec.layers;
  }

  get labels(): Readonly<Record<string, string>> {
    return this.parts.spec.labels;
  }

  get lastActiveAt(): number {
    return this.activeCalls > 0 ? Date.now() : this.active;
  }

  /** When its lifetime (idle TTL, hard deadline) says it must go, or undefined. */
  expiresAt(): number | undefined {
    const { idleTtlMs, deadlineMs } = this.parts.spec.lifetime ?? {};
    const limits = [
      ...(deadlineMs === undefined ? [] : [this.createdAt + deadlineMs]),
      ...(idleTtlMs === undefined || this.activeCalls > 0 ? [] : [this.lastActiveAt + idleTtlMs]),
    ];
    return limits.length ? Math.min(...limits) : undefined;
  }

  /** Ends the sandbox for a platform reason (its lifetime ran out), which its handle then reports. */
  async reclaim(reason: FailureReason): Promise<void> {
    this.failureReason = reason;
    await this.close();
  }

  get activeCalls(): number {
    return this.parts.channel.pendingCount;
  }

  get resources(): Readonly<SandboxResources> {
    return this.parts.spec.resources;
  }

  private onLauncherExit(): void {
    if (this.currentState === 'stopping' || this.currentState === 'stopped') return;
    this.currentState = 'failed';
    this.failureReason = 'agent_crash';
    this.parts.channel.fail(new SandgymError('agent_crash', `Sandbox ${this.id} stopped unexpectedly`));
  }

  /** Makes the sandbox ready for a request: a paused sandbox resumes transparently. */
  private async ready(what: string, signal: AbortSignal | undefined): Promise<void> {
    throwIfAborted(signal, what);
    this.active = Date.now();
    if (this.currentState === 'paused' || this.currentState === 'hibernated') await this.resume();
    if (this.currentState !== 'running') {
      const why = this.failureReason ? ` (${this.failureReason})` : '';
      throw new SandgymError(
        'failed_precondition',
        `Cannot ${what}: sandbox ${this.id} is ${this.currentState}${why}`,
      );
    }
  }

  exec(argv: string[], options: ExecOptions = {}): Promise<ExecResult> {
    return collectExec(this.execStream(argv, options));
  }

  execStream(argv: string[], options: ExecOptions = {}): ExecStream {
    const queue = new AsyncQueue<ExecChunk>();
    const result = this.run(argv, options, (chunk) => queue.push(chunk)).then(
      (done) => {
        queue.end();
        return done;
      },
      (error: unknown) => {
        queue.end(error);
        throw error;
      },
    );
    result.catch(() => undefined); // the caller may read only the output; the error reaches it there
    return { output: queue, result };
  }

  private async run(
    argv: string[],
    options: ExecOptions,
    onChunk: (chunk: ExecChunk) => void,
  ): Promise<ExecResult> {
    checkArgv(argv);
    await this.ready('run a command', options.signal);
    const stdin = typeof options.stdin === 'string' ? Buffer.from(options.stdin) : options.stdin;
    const user = options.user && options.user !== 'root' ? await this.lookUpUser(options.user) : undefined;
    // the spec's environment travels with every command: a warm sandbox's agent started without it
    const env = { ...this.parts.spec.env, ...(user?.home ? { HOME: user.home } : {}), ...options.env };
    const { id, exit } = this.parts.channel.exec(
      {
        op: 'exec',
        argv,
        uid: user?.uid,
        gid: user?.gid,
        env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
        cwd: options.cwd ?? this.parts.spec.workdir,
        stdin: stdin && stdin.length > 0 ? stdin : undefined,
        timeoutMs: options.timeoutMs ?? 0,
        outputCapBytes: options.outputCapBytes ?? this.parts.spec.resources.outputCapBytes,
      },
      (stream, data) => onChunk({ stream, data }),
    );
    const onAbort = (): void => this.parts.channel.cancel(id);
    options.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const ended = await exit;
      if (ended.cancelled) throw new SandgymError('cancelled', `Command ${argv[0]} was cancelled`);
      return { ...(await this.describeExit(ended)), stdout: '', stderr: '' };
    } finally {
      options.signal?.removeEventListener('abort', onAbort);
    }
  }

  private async lookUpUser(spec: string): Promise<ResolvedUser> {
    const read = (path: string): Promise<string> =>
      this.parts.channel.call({ op: 'read', path, maxBytes: 1 << 20 }).then(
        (reply) => Buffer.from(reply.data ?? new Uint8Array()).toString(),
        () => '',
      );
    return resolveUser(spec, await read('/etc/passwd'), await read('/etc/group'));
  }

  private async describeExit(ended: AgentExit): Promise<Omit<ExecResult, 'stdout' | 'stderr'>> {
    const signal = ended.signal === null ? null : (SIGNAL_NAMES.get(ended.signal) ?? `SIG${ended.signal}`);
    let oomKilled = false;
    if (signal === 'SIGKILL' && !ended.timedOut) {
      // A SIGKILL nobody asked for: the memory cgroup's OOM counter tells whether the kernel sent it.
      const { oomKills } = await this.parts.cgroup.usage();
      oomKilled = oomKills > this.seenOomKills;
      this.seenOomKills = oomKills;
    }
    return {
      exitCode: ended.exitCode,
      signal,
      stdoutBytes: ended.stdoutBytes,
      stderrBytes: ended.stderrBytes,
      stdoutTruncated: ended.stdoutTruncated,
      stderrTruncated: ended.stderrTruncated,
      timedOut: ended.timedOut,
      oomKilled,
      durationMs: ended.durationUs / 1000,
    };
  }

  async readFile(path: string, options: ReadFileOptions = {}): Promise<Buffer> {
    checkSandboxPath(path);
    await this.ready('read a file', options.signal);
    const reply = await this.parts.channel.call({
      op: 'read',
      path,
      maxBytes: options.maxBytes ?? 64 * 1024 * 1024,
    });
    return Buffer.from(reply.data ?? new Uint8Array());
  }

  async writeFile(path: string, data: string | Uint8Array, options: WriteFileOptions = {}): Promise<void> {
    checkSandboxPath(path);
    await this.ready('write a file', options.signal);
    const bytes = typeof data === 'string' ? Buffer.from(data) : data;
    await this.parts.channel.call(
      { op: 'write', path, data: bytes, mode: options.mode ?? 0o644 },
      callOptionsOf(options),
    );
  }

  async listDir(path: string, options: CallOptions = {}): Promise<DirEntry[]> {
    checkSandboxPath(path);
    await this.ready('list a directory', options.signal);
    const reply = await this.parts.channel.call({ op: 'list', path }, callOptionsOf(options));
    return (reply.entries ?? []).sort((a, b) => a.name.localeCompare(b.name));
  }

  async pause(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Pause');
    if (this.currentState === 'paused') return;
    await this.ready('pause', undefined);
    await this.parts.cgroup.setFrozen(true);
    this.currentState = 'paused';
  }

  async hibernate(options: CallOptions = {}): Promise<HibernateReport> {
    throwIfAborted(options.signal, 'Hibernate');
    if (this.currentState === 'hibernated') return { freedBytes: 0 };
    await this.pause();
    const freedBytes = await this.parts.cgroup.reclaim();
    // the swap areas its memory went to: it can only come back whole while they stay
    const swapped = await this.parts.cgroup.swappedBytes();
    this.swapAreas = swapped > 0 ? await activeSwapAreas() : [];
    this.currentState = 'hibernated';
    return { freedBytes, swappedBytes: swapped };
  }

  async resume(options: CallOptions = {}): Promise<void> {
    throwIfAborted(options.signal, 'Resume');
    if (this.currentState !== 'paused' && this.currentState !== 'hibernated') return;
    const wasHibernated = this.currentState === 'hibernated';
    await this.parts.cgroup.setFrozen(false);
    this.currentState = 'running';
    if (wasHibernated) await this.checkWholeAfterHibernation();
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
    const alive = await this.parts.channel.call({ op: 'ping' }, { timeoutMs: RESUME_CHECK_MS }).then(
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
    this.parts.channel.fail(error);
    throw error;
  }

  async stats(options: CallOptions = {}): Promise<SandboxStats> {
    throwIfAborted(options.signal, 'Stats');
    const [measured, pids, disk, deniedByRules] = await Promise.all([
      this.parts.cgroup.usage(),
      this.parts.cgroup.processes(),
      this.parts.diskUsage(),
      this.parts.network.denied(),
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
    await this.parts.network.set(rules);
  }

  async withWritableLayer<T>(consume: (dir: string) => Promise<T>, options: CallOptions = {}): Promise<T> {
    throwIfAborted(options.signal, 'Reading the writable layer');
    const wasPaused = this.currentState === 'paused';
    await this.ready('read the writable layer', undefined);
    await this.pause();
    try {
      return await consume(this.writableDir);
    } finally {
      if (!wasPaused) await this.resume();
    }
  }

  /** Marks the sandbox as going away; returns false when it already is. */
  beginStop(): boolean {
    if (this.currentState === 'stopping' || this.currentState === 'stopped') return false;
    this.currentState = 'stopping';
    return true;
  }

  markStopped(): void {
    this.currentState = 'stopped';
  }

  close(): Promise<void> {
    this.closing ??= this.parts.destroy(this);
    return this.closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
