import { createHash } from 'node:crypto';
import { writeSync } from 'node:fs';
import { mkdir, open, readFile, truncate, type FileHandle } from 'node:fs/promises';
import { dirname } from 'node:path';
import { SandgymError, messageOf, type Codec } from '../common/index.ts';

/** One logged step: what was asked, what came back, and when. */
export interface TrajectoryRecord {
  episodeId: string;
  stepIndex: number;
  action: unknown;
  result: unknown;
  startedAt: string;
  durationMs: number;
  /**
   * Set when the log kept only the head of the action's long strings (see {@link shrunk}): the
   * sha256 of the whole action, which a retry's action must match instead.
   */
  actionDigest?: string;
}

/**
 * That a step started: written before its action runs, so a node that dies while the action runs
 * finds, on restart, a step that may or may not have taken effect (`step_in_doubt`), never a gap
 * that a retry would fill by running the action again.
 */
export interface StepIntent {
  intent: true;
  episodeId: string;
  stepIndex: number;
  action: unknown;
  startedAt: string;
  /** As for {@link TrajectoryRecord.actionDigest}. */
  actionDigest?: string;
}

type Frame = TrajectoryRecord | StepIntent;

function isIntent(frame: Frame): frame is StepIntent {
  return (frame as Partial<StepIntent>).intent === true;
}

const HEADER_BYTES = 8;

/** What one sandbox's trajectory log may grow to, unless its sandbox's disk cap is less. */
export const DEFAULT_TRAJECTORY_CAP_BYTES = 256 * 2 ** 20;

/** Strings a shrunk frame keeps whole however many there are: names, kinds, codes, paths' ends. */
const SHORT_CHARS = 64;
/** Longer strings keep their head: at most this many characters each, and these in all per field. */
const CAPPED_STRING_CHARS = 1024;
const CAPPED_FIELD_CHARS = 4096;
/** Items kept of each array or map of a shrunk frame. */
const CAPPED_ITEMS = 64;
/**
 * What the log keeps free for each step that starts: room for its shrunk record, which is written
 * whatever happens once the action ran (its strings and items are capped above).
 */
const RECORD_ROOM_BYTES = 16 * 1024;

/**
 * A frame's field with its long strings cut to their head and its arrays and maps to their first
 * items, for the part of a log past its whole records: the step's outcome, exit code and signals
 * stay; outputs of megabytes do not. Buffers are cut likewise.
 */
function shrunk(value: unknown, capBytes: number, left = { chars: CAPPED_FIELD_CHARS }): unknown {
  if (typeof value === 'string') {
    if (value.length <= SHORT_CHARS) return value;
    const keep = Math.max(SHORT_CHARS, Math.min(CAPPED_STRING_CHARS, left.chars));
    left.chars -= keep;
    if (value.length <= keep) return value;
    return `${value.slice(0, keep)}…[${value.length - keep} more characters not logged: the trajectory log reached its cap of ${capBytes} bytes]`;
  }
  if (value instanceof Uint8Array && value.length > CAPPED_STRING_CHARS)
    return value.subarray(0, CAPPED_STRING_CHARS);
  if (Array.isArray(value)) return value.slice(0, CAPPED_ITEMS).map((item) => shrunk(item, capBytes, left));
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value)
        .slice(0, CAPPED_ITEMS)
        .map(([key, item]) => [key, shrunk(item, capBytes, left)]),
    );
  }
  return value;
}

function checksum(body: Buffer): number {
  return createHash('sha256').update(body).digest().readUInt32BE(0);
}

/**
 * A sandbox's append-only trajectory log: frames of [length, checksum, msgpack record], each
 * written (to the page cache) before the step's result is returned, and synced to the disk only
 * at a barrier ({@link sync}). Why that is enough for exactly once:
 * - a node process that dies leaves what it wrote in the page cache, where the process that
 *   adopts its sandboxes reads it: every answered step is there;
 * - a host that dies (power, kernel) takes its running sandboxes with it: no sandbox is left to
 *   run a step in twice, so the records of its last steps need not survive;
 * - the one sandbox that outlives the host is a durable one hibernated to a memory image, which
 *   the host's next node process adopts and resumes: its log is synced before the image is made
 *   (see ContainerBackendOptions.beforeImage), so the image holds no step its log lost. State
 *   packed into the layer store outlives the host too, but starts new sandboxes with logs of
 *   their own: no episode carries on from it, so none of its steps can run twice.
 * A crash can only leave a torn last frame; opening the log cuts it off, so the log always ends
 * on a whole record.
 *
 * The log never grows past its cap (the node's, or the sandbox's disk cap if less: the node keeps
 * no more for a sandbox than it may write). Its first seven eighths hold frames whole; past them a
 * frame keeps only the head of its long strings; a step that would leave no room for its record
 * is not taken (see {@link recordIntent}).
 */
export class TrajectoryLog {
  /** Records by episode, in step order: a step's record sits at its index. */
  private readonly byEpisode = new Map<string, TrajectoryRecord[]>();
  /** Every record, in order. */
  private readonly loaded: TrajectoryRecord[] = [];
  /** Steps that started and have no record yet, by `episode:index`. */
  private readonly intents = new Map<string, StepIntent>();
  /** Bytes of the file known to be on the disk; the sync under way, if one is; the first failed one. */
  private syncedBytes = 0;
  private syncing: Promise<void> | undefined;
  private syncFailure: SandgymError | undefined;

  private constructor(
    readonly path: string,
    private readonly codec: Codec,
    private readonly file: FileHandle,
    frames: Frame[],
    /** Bytes in the file. */
    private size: number,
    private capBytes: number,
  ) {
    for (const frame of frames) this.index(frame);
  }

  private index(frame: Frame): void {
    const key = `${frame.episodeId}:${frame.stepIndex}`;
    if (isIntent(frame)) {
      this.intents.set(key, frame);
      return;
    }
    this.intents.delete(key);
    const record = frame;
    this.loaded.push(record);
    let episode = this.byEpisode.get(record.episodeId);
    if (!episode) this.byEpisode.set(record.episodeId, (episode = []));
    episode.push(record);
  }

  /** Opens (or creates) the log at `path`, dropping a torn tail. */
  static async open(
    path: string,
    codec: Codec,
    capBytes = DEFAULT_TRAJECTORY_CAP_BYTES,
  ): Promise<TrajectoryLog> {
    await mkdir(dirname(path), { recursive: true });
    const bytes = await readFile(path).catch(() => Buffer.alloc(0));
    const frames: Frame[] = [];
    let offset = 0;
    while (offset + HEADER_BYTES <= bytes.length) {
      const length = bytes.readUInt32BE(offset);
      const end = offset + HEADER_BYTES + length;
      if (end > bytes.length) break;
      const body = bytes.subarray(offset + HEADER_BYTES, end);
      if (checksum(body) !== bytes.readUInt32BE(offset + 4)) break;
      frames.push(codec.decode(body) as Frame);
      offset = end;
    }
    if (offset < bytes.length) await truncate(path, offset);
    // tenants' commands and outputs: the node's root alone reads them
    return new TrajectoryLog(path, codec, await open(path, 'a', 0o600), frames, offset, capBytes);
  }

  /** Every record, in order. */
  get records(): readonly TrajectoryRecord[] {
    return this.loaded;
  }

  /** Lowers the log's cap (to its sandbox's disk cap); a cap is never raised. */
  lowerCap(capBytes: number): void {
    this.capBytes = Math.min(this.capBytes, capBytes);
  }

  /**
   * Appends a record, written before this returns (so before the step answers: a node process
   * that dies right after the answer leaves it in the page cache), not synced (see the class
   * comment). Past the whole part of the log, the record's long strings are cut (see
   * {@link shrunk}) and `capped` says so: the step ran, so it is logged once whatever room is
   * left (its start kept room for it).
   */
  append(given: TrajectoryRecord): { capped: boolean } {
    const { frame, body, capped } = this.fitted(given);
    this.writeFrame(body);
    this.index(frame);
    return { capped };
  }

  /**
   * The barrier before sandbox state that outlives the host is made: resolves once everything
   * written before the call is on the disk. Concurrent callers share a sync (group commit); one
   * that comes while a sync is under way waits for it and, if frames came after its start, for
   * one more. Once a sync failed, every later one fails: the kernel may have dropped the pages it
   * could not write, so a later sync that succeeds proves nothing about them.
   */
  async sync(): Promise<void> {
    while (this.syncedBytes < this.size) {
      this.syncing ??= this.syncOnce().finally(() => (this.syncing = undefined));
      await this.syncing;
    }
  }

  private async syncOnce(): Promise<void> {
    if (this.syncFailure) throw this.syncFailure;
    const upTo = this.size;
    try {
      await this.file.datasync();
    } catch (error) {
      this.syncFailure = new SandgymError(
        'platform_error',
        `Cannot sync the trajectory log ${this.path} to its disk (${messageOf(error)}): check the disk of the node's data dir; its later steps are not made durable`,
      );
      throw this.syncFailure;
    }
    this.syncedBytes = Math.max(this.syncedBytes, upTo);
  }

  /**
   * Records that a step starts; false, with nothing written, when the log has no room left for
   * the step and its record: the step must not run, since it could not be logged. Written before
   * the action runs, not synced (see the class comment): a node process that dies leaves it in
   * the page cache, where the restarted node reads it; a host that dies takes its sandboxes with
   * it, so nothing is left to doubt.
   */
  recordIntent(intent: Omit<StepIntent, 'intent'>): boolean {
    const { frame, body } = this.fitted({ intent: true, ...intent });
    if (this.size + HEADER_BYTES + body.length + RECORD_ROOM_BYTES > this.capBytes) return false;
    this.intents.set(`${intent.episodeId}:${intent.stepIndex}`, frame);
    this.writeFrame(body);
    return true;
  }

  /** The bytes in the log and its cap. */
  get room(): { usedBytes: number; capBytes: number } {
    return { usedBytes: this.size, capBytes: this.capBytes };
  }

  /** The bytes of the log known to be on the disk (a log opened again knows of none). */
  get durableBytes(): number {
    return this.syncedBytes;
  }

  /** `frame` as the log keeps it: whole in the first seven eighths of its cap, else shrunk. */
  private fitted<F extends Frame>(given: F): { frame: F; body: Buffer; capped: boolean } {
    const body = this.codec.encode(given);
    if (this.size + HEADER_BYTES + body.length <= this.capBytes - this.capBytes / 8) {
      return { frame: given, body, capped: false };
    }
    const frame: F = {
      ...given,
      action: shrunk(given.action, this.capBytes),
      ...('result' in given ? { result: shrunk(given.result, this.capBytes) } : {}),
      actionDigest: given.actionDigest ?? this.actionDigest(given.action),
    };
    return { frame, body: this.codec.encode(frame), capped: true };
  }

  /** What a frame whose action the log cut keeps of it (see {@link TrajectoryRecord.actionDigest}). */
  actionDigest(action: unknown): string {
    return createHash('sha256').update(this.codec.encode(action)).digest('hex');
  }

  /** The step that started at this index and has no record: it ran, or not, in a process now gone. */
  intent(episodeId: string, stepIndex: number): StepIntent | undefined {
    return this.intents.get(`${episodeId}:${stepIndex}`);
  }

  /**
   * Appends a frame to the file (not synced). Written synchronously: a copy into the page cache
   * takes microseconds, where a thread-pool write costs a round trip through another thread on
   * every step; only a barrier's sync, which waits for the disk, goes to the pool.
   */
  private writeFrame(body: Buffer): void {
    const header = Buffer.alloc(HEADER_BYTES);
    header.writeUInt32BE(body.length, 0);
    header.writeUInt32BE(checksum(body), 4);
    const frame = Buffer.concat([header, body]);
    for (let written = 0; written < frame.length;)
      written += writeSync(this.file.fd, frame, written, frame.length - written);
    this.size += frame.length;
  }

  /** The records of one episode, in step order (steps are appended in order from 0). */
  episode(episodeId: string): readonly TrajectoryRecord[] {
    return this.byEpisode.get(episodeId) ?? [];
  }

  async close(): Promise<void> {
    await this.file.close().catch(() => undefined);
  }
}
