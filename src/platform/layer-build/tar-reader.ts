import type { Readable } from 'node:stream';
import { SandgymError } from '../../common/index.ts';

/** The kinds of tar entry a layer may hold; anything else is refused by name. */
export type TarEntryType = 'file' | 'dir' | 'symlink' | 'hardlink' | 'char' | 'block' | 'fifo';

/** One entry's header; its data (for files) is read with {@link TarReader.readData}. */
export interface TarEntry {
  path: string;
  type: TarEntryType;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtimeS: number;
  linkTarget: string;
}

const TYPES: Record<string, TarEntryType> = {
  '0': 'file',
  '\0': 'file',
  '7': 'file',
  '1': 'hardlink',
  '2': 'symlink',
  '3': 'char',
  '4': 'block',
  '5': 'dir',
  '6': 'fifo',
};

/** Pax and GNU long-name headers hold names and a few numbers: more is an attack on memory. */
const MAX_META_BYTES = 1 << 20;
/** The largest uid or gid (2^32 - 2; the last value means "unchanged" to chown). */
const MAX_ID = 2 ** 32 - 2;
/** The last time ext4 holds (the year 2446). */
const MAX_TIME_S = 15_032_385_535;

function text(block: Buffer, start: number, length: number): string {
  const field = block.subarray(start, start + length);
  const end = field.indexOf(0);
  return field.subarray(0, end < 0 ? length : end).toString('utf8');
}

/** Octal, or GNU base-256 when the top bit of the first byte is set. */
function numeric(block: Buffer, start: number, length: number): number {
  const field = block.subarray(start, start + length);
  if ((field[0] ?? 0) & 0x80) {
    let value = (field[0] ?? 0) & 0x7f;
    for (const byte of field.subarray(1)) value = value * 256 + byte;
    return value;
  }
  const digits = text(block, start, length).trim();
  return digits ? parseInt(digits, 8) : 0;
}

function checksumOk(block: Buffer): boolean {
  let sum = 0;
  for (let i = 0; i < 512; i++) sum += i >= 148 && i < 156 ? 32 : (block[i] ?? 0);
  return sum === numeric(block, 148, 8);
}

/** `key=value` records of a pax extended header ("<len> key=value\n" each). */
function paxRecords(data: Buffer): Record<string, string> {
  const records: Record<string, string> = {};
  let offset = 0;
  while (offset < data.length) {
    const space = data.indexOf(0x20, offset);
    const length = parseInt(data.subarray(offset, space).toString(), 10);
    if (space < 0 || !Number.isFinite(length) || length <= 0) break;
    const record = data.subarray(space + 1, offset + length - 1).toString('utf8');
    const eq = record.indexOf('=');
    records[record.slice(0, eq)] = record.slice(eq + 1);
    offset += length;
  }
  return records;
}

/**
 * Reads a tar stream (ustar, pax and GNU long names) entry by entry, without buffering whole
 * files: the caller reads each file's data as a stream of chunks before asking for the next.
 */
export class TarReader {
  private buffered: Buffer[] = [];
  private size = 0;
  private ended = false;
  private readonly source: AsyncIterator<Buffer>;
  private pendingData = 0;
  private pendingPadding = 0;

  constructor(
    stream: Readable,
    private readonly name: string,
  ) {
    this.source = stream[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  }

  private async fill(bytes: number): Promise<boolean> {
    while (this.size < bytes && !this.ended) {
      const next = await this.source.next();
      if (next.done) this.ended = true;
      else {
        this.buffered.push(next.value);
        this.size += next.value.length;
      }
    }
    return this.size >= bytes;
  }

  private take(bytes: number): Buffer {
    const whole = this.buffered.length === 1 ? this.buffered[0]! : Buffer.concat(this.buffered, this.size);
    const taken = whole.subarray(0, bytes);
    const rest = whole.subarray(bytes);
    this.buffered = rest.length ? [rest] : [];
    this.size = rest.length;
    return taken;
  }

  private async exactly(bytes: number): Promise<Buffer> {
    if (!(await this.fill(bytes)))
      throw new SandgymError('invalid_argument', `${this.name} is truncated: it ends inside an entry`);
    return Buffer.from(this.take(bytes));
  }

  private async skipPending(): Promise<void> {
    for await (const chunk of this.readData()) void chunk;
    if (this.pendingPadding) await this.exactly(this.pendingPadding);
    this.pendingPadding = 0;
  }

  /** The data of the entry last returned, in chunks. */
  async *readData(): AsyncGenerator<Buffer> {
    while (this.pendingData > 0) {
      if (!(await this.fill(1)))
        throw new SandgymError('invalid_argument', `${this.name} is truncated: it ends inside a file`);
      const chunk = this.take(Math.min(this.pendingData, this.size, 1 << 20));
      this.pendingData -= chunk.length;
      yield chunk;
    }
  }

  /** The next entry, or undefined at the end of the archive. */
  async next(): Promise<TarEntry | undefined> {
    await this.skipPending();
    let longPath: string | undefined;
    let longLink: string | undefined;
    let pax: Record<string, string> = {};
    for (;;) {
      if (!(await this.fill(512))) {
        if (this.size === 0) return undefined; // some writers omit the end-of-archive blocks
        throw new SandgymError('invalid_argument', `${this.name} is truncated: it ends inside a header`);
      }
      const block = this.take(512);
      if (block.every((b) => b === 0)) return undefined;
      if (!checksumOk(block))
        throw new SandgymError(
          'invalid_argument',
          `${this.name} is not a tar archive, or is corrupt (bad header checksum)`,
        );
      const flag = String.fromCharCode(block[156] ?? 0);
      const size = numeric(block, 124, 12);
      const padding = (512 - (size % 512)) % 512;
      if (flag === 'x' || flag === 'g' || flag === 'L' || flag === 'K') {
        if (size > MAX_META_BYTES)
          throw new SandgymError(
            'invalid_argument',
            `${this.name}: a pax or long-name header of ${size} bytes is refused (at most ${MAX_META_BYTES})`,
          );
        const data = (await this.exactly(size + padding)).subarray(0, size);
        if (flag === 'x') pax = { ...pax, ...paxRecords(data) };
        if (flag === 'L') longPath = text(data, 0, data.length);
        if (flag === 'K') longLink = text(data, 0, data.length);
        continue;
      }
      const type = TYPES[flag];
      const prefix = text(block, 345, 155);
      const headerPath = prefix ? `${prefix}/${text(block, 0, 100)}` : text(block, 0, 100);
      const path = pax['path'] ?? longPath ?? headerPath;
      if (!type)
        throw new SandgymError(
          'invalid_argument',
          `${this.name}: entry "${path}" has unsupported tar type "${flag}"`,
        );
      const whole = (name: string, value: number, max: number): number => {
        if (Number.isInteger(value) && value >= 0 && value <= max) return value;
        throw new SandgymError(
          'invalid_argument',
          `${this.name}: entry "${path}" has an invalid ${name} (${value})`,
        );
      };
      const mtime = Math.floor(Number(pax['mtime'] ?? numeric(block, 136, 12)));
      const entry: TarEntry = {
        path,
        type,
        mode: numeric(block, 100, 8) & 0o7777,
        uid: whole('uid', Number(pax['uid'] ?? numeric(block, 108, 8)), MAX_ID),
        gid: whole('gid', Number(pax['gid'] ?? numeric(block, 116, 8)), MAX_ID),
        size: type === 'file' ? whole('size', Number(pax['size'] ?? size), Number.MAX_SAFE_INTEGER) : 0,
        // a time is no attack: one before 1970 or past what a file can hold is kept at the bound
        mtimeS: Number.isNaN(mtime) ? 0 : Math.min(Math.max(mtime, 0), MAX_TIME_S),
        linkTarget: pax['linkpath'] ?? longLink ?? text(block, 157, 100),
      };
      this.pendingData = entry.size;
      this.pendingPadding = (512 - (entry.size % 512)) % 512;
      if (type !== 'file' && size > 0) this.pendingPadding = size + padding; // data we do not use
      return entry;
    }
  }
}
