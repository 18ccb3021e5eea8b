import { createHash } from 'node:crypto';
import { mkdir, open, readFile, truncate, type FileHandle } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { Codec } from '../common/index.ts';

/** One logged step: what was asked, what came back, and when. */
export interface TrajectoryRecord {
  episodeId: string;
  stepIndex: number;
  action: unknown;
  result: unknown;
  startedAt: string;
  durationMs: number;
}

const HEADER_BYTES = 8;

/** What one sandbox's trajectory log may grow to before its records lose their long outputs. */
export const DEFAULT_TRAJECTORY_CAP_BYTES = 256 * 2 ** 20;

/** Strings kept whole in a record written past the cap; longer ones keep their head only. */
const CAPPED_STRING_CHARS = 1024;

/**
 * A record with every long string cut to its head, for a log past its cap: the step's action,
 * outcome, exit code and signals stay; outputs of megabytes do not. Buffers are dropped likewise.
 */
function shrunk(value: unknown, capBytes: number): unknown {
  if (typeof value === 'string' && value.length > CAPPED_STRING_CHARS) {
    return `${value.slice(0, CAPPED_STRING_CHARS)}…[${value.length - CAPPED_STRING_CHARS} more characters not logged: the trajectory log reached its cap of ${capBytes} bytes]`;
  }
  if (value instanceof Uint8Array && value.length > CAPPED_STRING_CHARS)
    return value.subarray(0, CAPPED_STRING_CHARS);
  if (Array.isArray(value)) return value.map((item) => shrunk(item, capBytes));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, shrunk(item, capBytes)]));
  }
  return value;
}

function checksum(body: Buffer): number {
  return createHash('sha256').update(body).digest().readUInt32BE(0);
}

/**
 * A sandbox's append-only trajectory log: frames of [length, checksum, msgpack record], each
 * fsynced before the step's result is returned. A crash can only leave a torn last frame; opening
 * the log cuts it off, so the log always ends on a whole record.
 */
export class TrajectoryLog {
  /** Records by episode, in step order: a step's record sits at its index. */
  private readonly byEpisode = new Map<string, TrajectoryRecord[]>();

  private constructor(
    readonly path: string,
    private readonly codec: Codec,
    private readonly file: FileHandle,
    private readonly loaded: TrajectoryRecord[],
    /** Bytes in the file. */
    private size: number,
    private readonly capBytes: number,
  ) {
    for (const record of loaded) this.index(record);
  }

  private index(record: TrajectoryRecord): void {
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
    const records: TrajectoryRecord[] = [];
    let offset = 0;
    while (offset + HEADER_BYTES <= bytes.length) {
      const length = bytes.readUInt32BE(offset);
      const end = offset + HEADER_BYTES + length;
      if (end > bytes.length) break;
      const body = bytes.subarray(offset + HEADER_BYTES, end);
      if (checksum(body) !== bytes.readUInt32BE(offset + 4)) break;
      records.push(codec.decode(body) as TrajectoryRecord);
      offset = end;
    }
    if (offset < bytes.length) await truncate(path, offset);
    // tenants' commands and outputs: the node's root alone reads them
    return new TrajectoryLog(path, codec, await open(path, 'a', 0o600), records, offset, capBytes);
  }

  /** Every record, in order. */
  get records(): readonly TrajectoryRecord[] {
    return this.loaded;
  }

  /**
   * Appends a record and makes it durable before returning. Past the log's cap, the record's long
   * strings are cut (see {@link shrunk}) and `capped` says so: the step is still logged once.
   */
  async append(given: TrajectoryRecord): Promise<{ capped: boolean }> {
    let record = given;
    let body = this.codec.encode(record);
    const capped = this.size + HEADER_BYTES + body.length > this.capBytes;
    if (capped) {
      record = shrunk(given, this.capBytes) as TrajectoryRecord;
      body = this.codec.encode(record);
    }
    const header = Buffer.alloc(HEADER_BYTES);
    header.writeUInt32BE(body.length, 0);
    header.writeUInt32BE(checksum(body), 4);
    await this.file.write(Buffer.concat([header, body]));
    await this.file.datasync();
    this.size += HEADER_BYTES + body.length;
    this.loaded.push(record);
    this.index(record);
    return { capped };
  }

  /** The records of one episode, in step order (steps are appended in order from 0). */
  episode(episodeId: string): readonly TrajectoryRecord[] {
    return this.byEpisode.get(episodeId) ?? [];
  }

  async close(): Promise<void> {
    await this.file.close().catch(() => undefined);
  }
}
