import { constants } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { SandgymError, type FailureReason } from '../../common/index.ts';
import { callOptionsOf } from '../call-options.ts';
import { collectExec, streamExec } from '../collect-exec.ts';
import { REPORT_FD } from '../contract.ts';
import type {
  BackendName,
  BackendSandbox,
  CallOptions,
  CheckpointOptions,
  DirListing,
  ExecChunk,
  ExecOptions,
  ExecResult,
  ExecStream,
  HibernateOptions,
  HibernateReport,
  LayerImage,
  ListDirOptions,
  ReadFileOptions,
  SandboxCheckpoint,
  SandboxResources,
  SandboxSpec,
  SandboxState,
  SandboxStats,
  WritableLayerOptions,
  WriteFileOptions,
  WrittenPathsOptions,
} from '../contract.ts';
import type { FilterReport } from '../host/diff-filter.ts';
import type { AgentChannel } from './agent-channel.ts';
import type { AgentExit } from './agent-protocol.ts';
import { checkArgv, checkEnv, checkSandboxPath, throwIfAborted } from './checks.ts';
import { expiryOf } from './lifetime.ts';
import { isRootUser, resolveUser, type ResolvedUser } from './users.ts';

/**
 * How long a file call (read, write, list) may take when the caller sets no deadline. The agent
 * serves one request at a time, so a call that never ends would stall every later one; this is
 * the backstop behind the agent's own refusal to wait on what a sandbox planted.
 */
const DEFAULT_FILE_CALL_TIMEOUT_MS = 60_000;

/** The first agent protocol whose file calls and commands take a user (agent/agent.c). */
const USER_PROTOCOL_VERSION = 2;

/** How long a failed request waits to learn why the agent died. */
const EXIT_EXPLANATION_MS = 2_000;

const SIGNAL_NAMES = new Map<number, string>(
  Object.entries(constants.signals).map(([name, number]) => [number, name]),
);

/**
 * What every sandbox with the in-sandbox agent has in common, whatever isolates it (a container,
 * a VM): commands, files and users through the agent channel, its lifetime, and the states a
 * request finds it in. Subclasses say how it pauses, measures and ends.
 */
export abstract class AgentSandbox implements BackendSandbox {
  abstract readonly backend: BackendName;
  readonly id: string;
  protected currentState: SandboxState = 'running';
  protected failureReason: FailureReason | undefined;
  protected active = Date.now();
  readonly createdAt: number;
  private closing: Promise<void> | undefined;
  /**
   * The agent's process state as its last command left it, when that left no other process in
   * the sandbox; undefined while a command runs or when one was left.
   */
  protected agentStateAfterLastCommand: string | undefined;

  protected constructor(
    protected readonly spec: SandboxSpec,
    createdAt: number | undefined,
  ) {
    this.id = spec.id;
    this.createdAt = createdAt ?? Date.now();
  }

  /** The channel to its agent now (a VM restored from a snapshot has a new one). */
  protected abstract get channel(): AgentChannel;

  /**
   * Fails the sandbox when `exited` resolves (its runtime or VM is gone, or the channel closed),
   * unless it is going away anyway or `current` says that exit is no longer its own (a VM
   * replaced by its restore).
   */
  protected watchExit(exited: Promise<void>, current: () => boolean = () => true): void {
    this.exitExplained = exited.then(async () => {
      if (current()) await this.onExit();
    });
  }

  /** Settles once an unexpected exit has been told apart (see {@link causeOfExit}). */
  private exitExplained: Promise<void> = new Promise(() => undefined);

  /**
   * Why the agent went away on its own: `agent_crash` unless a backend knows better (a container
   * whose agent the OOM killer ended inside the sandbox's own memory limit: `oom`).
   */
  protected causeOfExit(): Promise<FailureReason> {
    return Promise.resolve('agent_crash');
  }

  get state(): SandboxState {
    return this.currentState;
  }

  get failure(): FailureReason | undefined {
    return this.failureReason;
  }

  get layers(): readonly LayerImage[] {
    return this.spec.layers;
  }

  get labels(): Readonly<Record<string, string>> {
    return this.spec.labels;
  }

  get lastActiveAt(): number {
    return this.activeCalls > 0 ? Date.now() : this.active;
  }

  /** When its lifetime (idle TTL, hard deadline) says it must go, or undefined. */
  expiresAt(): number | undefined {
    return expiryOf(this.spec.lifetime, this);
  }

  /** Ends the sandbox for a platform reason (its lifetime ran out), which its handle then reports. */
  async reclaim(reason: FailureReason): Promise<void> {
    this.failureReason = reason;
    await this.close();
  }

  get activeCalls(): number {
    return this.channel.pendingCount;
  }

  /** Its spec under another id: what a copy of it (a memory fork) is created from. */
  specFor(id: string): SandboxSpec {
    return { ...this.spec, id };
  }

  get resources(): Readonly<SandboxResources> {
    return this.spec.resources;
  }

  private async onExit(): Promise<void> {
    if (this.isEnding()) return;
    const reason = await this.causeOfExit().catch((): FailureReason => 'agent_crash');
    if (this.isEnding()) return; // closed while the cause was read
    this.currentState = 'failed';
    this.failureReason = reason;
    this.channel.fail(this.exitError());
  }

  private isEnding(): boolean {
    return this.currentState === 'stopping' || this.currentState === 'stopped';
  }

  private exitError(): SandgymError {
    return this.failureReason === 'oom'
      ? new SandgymError(
          'oom',
          `Sandbox ${this.id} ran out of its own memory (memoryMib ${this.spec.resources.memoryMib}) and the OOM killer ended its agent`,
        )
      : new SandgymError('agent_crash', `Sandbox ${this.id} stopped unexpectedly`);
  }

  /**
   * Runs a request; when the agent dies under it, the error says why (its own OOM, say) once
   * that is known, rather than the bare channel failure that arrives first.
   */
  private async explained<T>(request: Promise<T>): Promise<T> {
    try {
      return await request;
    } catch (error) {
      if (!(error instanceof SandgymError) || error.code !== 'agent_crash') throw error;
      await Promise.race([this.exitExplained, sleep(EXIT_EXPLANATION_MS, undefined, { ref: false })]);
      throw this.failureReason === 'oom' ? this.exitError() : error;
    }
  }

  /** Makes the sandbox ready for a request: a paused sandbox resumes transparently. */
  protected async ready(what: string, signal: AbortSignal | undefined): Promise<void> {
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
    return streamExec((onChunk) => this.explained(this.run(argv, options, onChunk)));
  }

  private async run(
    argv: string[],
    options: ExecOptions,
    onChunk: (chunk: ExecChunk) => void,
  ): Promise<ExecResult> {
    checkArgv(argv);
    if (options.env) checkEnv(options.env);
    if (options.cwd !== undefined) checkSandboxPath(options.cwd);
    await this.ready('run a command', options.signal);
    const stdin = typeof options.stdin === 'string' ? Buffer.from(options.stdin) : options.stdin;
    const user = await this.actingAs(options.user);
    // the spec's environment travels with every command: a warm sandbox's agent started without it
    const env = {
      ...this.spec.env,
      ...(user?.home ? { HOME: user.home } : {}),
      ...options.env,
      ...(options.reportChannel ? { SANDGYM_REPORT_FD: String(REPORT_FD) } : {}),
    };
    const { id, exit } = this.channel.exec(
      {
        op: 'exec',
        argv,
        ...credentialsOf(user),
        env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
        cwd: options.cwd ?? this.spec.workdir,
        stdin: stdin && stdin.length > 0 ? stdin : undefined,
        timeoutMs: options.timeoutMs ?? 0,
        outputCapBytes: options.outputCapBytes ?? this.spec.resources.outputCapBytes,
        reportFd: options.reportChannel ? REPORT_FD : undefined,
      },
      (stream, data) => onChunk({ stream, data }),
    );
    const onAbort = (): void => this.channel.cancel(id);
    options.signal?.addEventListener('abort', onAbort, { once: true });
    this.agentStateAfterLastCommand = undefined;
    try {
      const ended = await exit;
      this.agentStateAfterLastCommand = ended.agentStateAlone;
      if (ended.cancelled) throw new SandgymError('cancelled', `Command ${argv[0]} was cancelled`);
      return { ...(await this.describeExit(ended)), stdout: '', stderr: '' };
    } finally {
      options.signal?.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Who a call acts as: `user` resolved against the sandbox's own /etc/passwd and /etc/group
   * (read as root, at the time of the call, as `docker exec --user` does), or undefined for root.
   * The agent must be one that takes a user on every call: an older one would do a file call as
   * root.
   */
  private async actingAs(user: string | undefined): Promise<ResolvedUser | undefined> {
    if (isRootUser(user)) return undefined;
    if (this.channel.agentVersion < USER_PROTOCOL_VERSION) {
      throw new SandgymError(
        'failed_precondition',
        `Sandbox ${this.id} runs an agent of protocol ${this.channel.agentVersion}, which cannot act as user "${user}": make a new sandbox`,
      );
    }
    const read = (path: string): Promise<string> =>
      this.channel.call({ op: 'read', path, maxBytes: 1 << 20 }, fileCallOptions({})).then(
        (reply) => Buffer.from(reply.data ?? new Uint8Array()).toString(),
        () => '',
      );
    const [passwd, group] = await Promise.all([read('/etc/passwd'), read('/etc/group')]);
    return resolveUser(user, passwd, group);
  }

  private async describeExit(ended: AgentExit): Promise<Omit<ExecResult, 'stdout' | 'stderr'>> {
    const signal = ended.signal === null ? null : (SIGNAL_NAMES.get(ended.signal) ?? `SIG${ended.signal}`);
    // a SIGKILL nobody asked for may be the kernel's OOM killer
    const oomKilled = signal === 'SIGKILL' && !ended.timedOut && (await this.oomKilledSinceLastCheck());
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
      ...(ended.reportBytes === undefined
        ? {}
        : { reportBytes: ended.reportBytes, reportTruncated: ended.reportTruncated ?? false }),
    };
  }

  async readFile(path: string, options: ReadFileOptions = {}): Promise<Buffer> {
    checkSandboxPath(path);
    await this.ready('read a file', options.signal);
    const user = await this.actingAs(options.user);
    const reply = await this.explained(
      this.channel.call(
        { op: 'read', path, maxBytes: options.maxBytes ?? 64 * 1024 * 1024, ...credentialsOf(user) },
        fileCallOptions(options),
      ),
    );
    return Buffer.from(reply.data ?? new Uint8Array());
  }

  async writeFile(path: string, data: string | Uint8Array, options: WriteFileOptions = {}): Promise<void> {
    checkSandboxPath(path);
    await this.ready('write a file', options.signal);
    const bytes = typeof data === 'string' ? Buffer.from(data) : data;
    const user = await this.actingAs(options.user);
    await this.explained(
      this.channel.call(
        { op: 'write', path, data: bytes, mode: options.mode ?? 0o644, ...credentialsOf(user) },
        fileCallOptions(options),
      ),
    );
  }

  async listDir(path: string, options: ListDirOptions = {}): Promise<DirListing> {
    checkSandboxPath(path);
    await this.ready('list a directory', options.signal);
    const user = await this.actingAs(options.user);
    const reply = await this.explained(
      this.channel.call({ op: 'list', path, ...credentialsOf(user) }, fileCallOptions(options)),
    );
    const entries = (reply.entries ?? []).sort((a, b) => a.name.localeCompare(b.name));
    return reply.truncated ? Object.assign(entries, { truncated: true }) : entries;
  }

  /** Whether the OOM killer ended a process since the last time this was asked. */
  protected abstract oomKilledSinceLastCheck(): Promise<boolean>;

  /** Tears the sandbox down; called once, by close(). */
  protected abstract destroy(): Promise<void>;

  abstract pause(options?: CallOptions): Promise<void>;
  abstract hibernate(options?: HibernateOptions): Promise<HibernateReport>;
  abstract resume(options?: CallOptions): Promise<void>;
  abstract checkpoint(options?: CheckpointOptions): Promise<SandboxCheckpoint>;
  abstract restore(checkpoint: SandboxCheckpoint | string, options?: CallOptions): Promise<void>;
  abstract stats(options?: CallOptions): Promise<SandboxStats>;
  abstract setNetwork(rules: readonly string[], options?: CallOptions): Promise<void>;
  abstract writtenPaths(prefixes: readonly string[], options?: WrittenPathsOptions): Promise<string[]>;
  abstract withWritableLayer<T>(
    consume: (dir: string, report: FilterReport) => Promise<T>,
    options?: WritableLayerOptions,
  ): Promise<T>;

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
    this.closing ??= this.destroy();
    return this.closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** What a request carries of its user: nothing for root, so the agent keeps its own credentials. */
function credentialsOf(user: ResolvedUser | undefined): { uid?: number; gid?: number; groups?: number[] } {
  return user ? { uid: user.uid, gid: user.gid, groups: user.groups } : {};
}

/** A file call's cancellation, with the default deadline when the caller gave none. */
function fileCallOptions(options: CallOptions): CallOptions {
  return { ...callOptionsOf(options), timeoutMs: options.timeoutMs ?? DEFAULT_FILE_CALL_TIMEOUT_MS };
}
