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
  ) {
    for (const record of loaded) this.index(record);
  }

  private index(record: TrajectoryRecord): void {
    let episode = this.byEpisode.get(record.episodeId);
    if (!episode) this.byEpisode.set(record.episodeId, (episode = []));
    episode.push(record);
  }

  /** Opens (or creates) the log at `path`, dropping a torn tail. */
  static async open(path: string, codec: Codec): Promise<TrajectoryLog> {
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
    return new TrajectoryLog(path, codec, await open(path, 'a'), records);
  }

  /** Every record, in order. */
  get records(): readonly TrajectoryRecord[] {
    return this.loaded;
  }

  /** Appends a record and makes it durable before returning. */
  async append(record: TrajectoryRecord): Promise<void> {
    const body = this.codec.encode(record);
    const header = Buffer.alloc(HEADER_BYTES);
    header.writeUInt32BE(body.length, 0);
    header.writeUInt32BE(checksum(body), 4);
    await this.file.write(Buffer.concat([header, body]));
    await this.file.datasync();
    this.loaded.push(record);
    this.index(record);
  }

  /** The records of one episode, in step order (steps are appended in order from 0). */
  episode(episodeId: string): readonly TrajectoryRecord[] {
    return this.byEpisode.get(episodeId) ?? [];
  }

  async close(): Promise<void> {
    await this.file.close().catch(() => undefined);
  }
}
