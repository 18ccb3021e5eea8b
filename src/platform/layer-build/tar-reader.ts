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

/**
 * Pax and GNU long-name headers hold names and a few numbers: more, in one header or in all those
 * before one entry together, is an attack on memory.
 */
const MAX_META_BYTES = 1 << 20;
/** How much of the data of an entry we do not keep (a folder's or a link's) is read at a time. */
const SKIP_CHUNK = 1 << 20;
/** The largest uid or gid (2^32 - 2; the last value means "unchanged" to chown). */
const MAX_ID = 2 ** 32 - 2;
/** The last time ext4 holds (the year 2446). */
const MAX_TIME_S = 15_032_385_535;

/** A NUL-ended field's bytes. */
function field(block: Buffer, start: number, length: number): Buffer {
  const bytes = block.subarray(start, start + length);
  const end = bytes.indexOf(0);
  return bytes.subarray(0, end < 0 ? length : end);
}

function text(block: Buffer, start: number, length: number): string {
  return field(block, start, length).toString('utf8');
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

/**
 * `key=value` records of a pax extended header ("<len> key=value\n" each), read in one pass: a
 * record that is not exactly that (a length that is not all digits, one running past the header,
 * no "=" or no final newline) is refused, as Go's archive/tar does, rather than guessed at.
 */
function paxRecords(data: Buffer, refuse: (why: string) => never): Map<string, string> {
  const records = new Map<string, string>();
  let offset = 0;
  while (offset < data.length) {
    let length = 0;
    let at = offset;
    // at most 8 digits: a header is at most 1 MiB
    while (at < data.length && at - offset < 8 && data[at]! >= 0x30 && data[at]! <= 0x39)
      length = length * 10 + data[at++]! - 0x30;
    const end = offset + length;
    if (at === offset || data[at] !== 0x20 || end > data.length || end <= at + 1 || data[end - 1] !== 0x0a)
      refuse(`a pax record at byte ${offset} is malformed`);
    const eq = data.indexOf(0x3d, at + 1);
    if (eq < 0 || eq >= end - 1) refuse(`a pax record at byte ${offset} has no "="`);
    const key = utf8(data.subarray(at + 1, eq), refuse);
    const value = data.subarray(eq + 1, end - 1);
    // names must be exact; other values are numbers, or bytes we do not use (an xattr's, such
    // as a file capability, is binary)
    records.set(key, NAME_KEYS.has(key) ? utf8(value, refuse) : value.toString('utf8'));
    offset = end;
  }
  return records;
}

/** The pax keys that hold names. */
const NAME_KEYS = new Set(['path', 'linkpath']);

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * Bytes as UTF-8, refused when they are not: a lossy decoding would map two byte-different names
 * to one, so an entry could silently replace another (and a layer could not hold the original).
 */
function utf8(bytes: Uint8Array, refuse: (why: string) => never): string {
  try {
    return strictUtf8.decode(bytes);
  } catch {
    refuse(`the name "${Buffer.from(bytes).toString('utf8').slice(0, 80)}" is not valid UTF-8`);
  }
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
  /** Bytes after the entry's data to read past: padding, or all the data of a non-file entry. */
  private pendingSkip = 0;

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

  /** Reads past what is left of the last entry, a chunk at a time: its size is the archive's word. */
  private async skipPending(): Promise<void> {
    for await (const chunk of this.readData()) void chunk;
    while (this.pendingSkip > 0) {
      if (!(await this.fill(1)))
        throw new SandgymError('invalid_argument', `${this.name} is truncated: it ends inside an entry`);
      this.pendingSkip -= this.take(Math.min(this.pendingSkip, this.size, SKIP_CHUNK)).length;
    }
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
    let longPath: Buffer | undefined;
    let longLink: Buffer | undefined;
    const pax = new Map<string, string>();
    let metaBytes = 0;
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
      const headerName = Buffer.from(
        block[345]
          ? Buffer.concat([field(block, 345, 155), Buffer.from('/'), field(block, 0, 100)])
          : field(block, 0, 100),
      );
      const refuse = (why: string): never => {
        const shown = pax.get('path') ?? (longPath ?? headerName).toString('utf8');
        throw new SandgymError('invalid_argument', `${this.name}: entry "${shown}" is refused: ${why}`);
      };
      if (flag === 'x' || flag === 'g' || flag === 'L' || flag === 'K') {
        metaBytes += size;
        if (metaBytes > MAX_META_BYTES)
          throw new SandgymError(
            'invalid_argument',
            `${this.name}: pax or long-name headers of ${metaBytes} bytes before one entry are refused (at most ${MAX_META_BYTES})`,
          );
        const data = (await this.exactly(size + padding)).subarray(0, size);
        if (flag === 'x') for (const [key, value] of paxRecords(data, refuse)) pax.set(key, value);
        if (flag === 'L') longPath = field(data, 0, data.length);
        if (flag === 'K') longLink = field(data, 0, data.length);
        continue;
      }
      const type = TYPES[flag];
      const path = pax.get('path') ?? utf8(longPath ?? headerName, refuse);
      if (!type)
        throw new SandgymError(
          'invalid_argument',
          `${this.name}: entry "${path}" has unsupported tar type "${flag}"${flag === 'S' ? ' (a GNU sparse file)' : ''}`,
        );
      // pax sparse files (GNU 0.0, 0.1, 1.0) store a map, not the file: unpacked as it is, the
      // file would be wrong without a word
      if ([...pax.keys()].some((key) => key.startsWith('GNU.sparse.')))
        refuse('sparse files are not supported: archive it without --sparse');
      const whole = (name: string, value: number, max: number): number => {
        if (Number.isInteger(value) && value >= 0 && value <= max) return value;
        throw new SandgymError(
          'invalid_argument',
          `${this.name}: entry "${path}" has an invalid ${name} (${value})`,
        );
      };
      const mtime = Math.floor(Number(pax.get('mtime') ?? numeric(block, 136, 12)));
      const dataSize = whole('size', Number(pax.get('size') ?? size), Number.MAX_SAFE_INTEGER);
      const entry: TarEntry = {
        path,
        type,
        mode: numeric(block, 100, 8) & 0o7777,
        uid: whole('uid', Number(pax.get('uid') ?? numeric(block, 108, 8)), MAX_ID),
        gid: whole('gid', Number(pax.get('gid') ?? numeric(block, 116, 8)), MAX_ID),
        size: type === 'file' ? dataSize : 0,
        // a time is no attack: one before 1970 or past what a file can hold is kept at the bound
        mtimeS: Number.isNaN(mtime) ? 0 : Math.min(Math.max(mtime, 0), MAX_TIME_S),
        linkTarget: pax.get('linkpath') ?? utf8(longLink ?? field(block, 157, 100), refuse),
      };
      const dataPadding = (512 - (dataSize % 512)) % 512;
      this.pendingData = entry.size;
      // the data of a folder, a link or a device is no use to us: it is read past, never kept
      this.pendingSkip = (type === 'file' ? 0 : dataSize) + dataPadding;
      return entry;
    }
  }
}
