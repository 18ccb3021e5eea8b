import { gzipSync } from 'node:zlib';

/** One entry of a test archive. */
export interface TestTarEntry {
  path: string;
  type?: 'file' | 'dir' | 'symlink' | 'hardlink' | 'char' | 'block' | 'fifo';
  data?: string | Buffer;
  linkTarget?: string;
  mode?: number;
  /**
   * How a path or link target longer than the header's 100 bytes (or holding a NUL byte) is
   * written: a pax extended header (the default), or GNU's `././@LongLink` entries.
   */
  longNames?: 'pax' | 'gnu';
}

const FLAGS = { file: '0', hardlink: '1', symlink: '2', char: '3', block: '4', dir: '5', fifo: '6' } as const;

function field(block: Buffer, offset: number, length: number, value: string): void {
  block.write(value, offset, length, 'utf8');
}

function octal(block: Buffer, offset: number, length: number, value: number): void {
  field(block, offset, length, `${value.toString(8).padStart(length - 1, '0')}\0`);
}

/** One 512-byte header with its checksum, then the data padded to a whole block. */
function record(
  path: string,
  flag: string,
  data: Buffer,
  options: { mode: number; linkTarget?: string },
): Buffer[] {
  const header = Buffer.alloc(512);
  field(header, 0, 100, path);
  octal(header, 100, 8, options.mode);
  octal(header, 108, 8, 0);
  octal(header, 116, 8, 0);
  octal(header, 124, 12, data.length);
  octal(header, 136, 12, 1_700_000_000);
  field(header, 156, 1, flag);
  field(header, 157, 100, options.linkTarget ?? '');
  field(header, 257, 6, 'ustar\0');
  field(header, 263, 2, '00');
  header.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of header) sum += byte;
  field(header, 148, 8, `${sum.toString(8).padStart(6, '0')}\0 `);
  return [header, data, Buffer.alloc((512 - (data.length % 512)) % 512)];
}

/**
 * One raw 512-byte header claiming `size` bytes of data, whatever its type: the data (and its
 * padding) is the caller's to stream after it, so a test can claim gigabytes without holding them.
 */
export function tarHeader(
  path: string | Buffer,
  type: keyof typeof FLAGS | 'x' | 'L' | 'S',
  size: number,
  linkTarget = '',
): Buffer {
  const flag = type in FLAGS ? FLAGS[type as keyof typeof FLAGS] : type;
  const [header] = record('', flag, Buffer.alloc(0), { mode: 0o644, linkTarget });
  Buffer.from(path).copy(header!, 0, 0, 100);
  octal(header!, 124, 12, size);
  header!.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of header!) sum += byte;
  field(header!, 148, 8, `${sum.toString(8).padStart(6, '0')}\0 `);
  return header!;
}

/** A pax record, "<length> key=value\n", its length counting itself. */
export function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const bodyBytes = Buffer.byteLength(body);
  let length = bodyBytes + 1;
  while (String(length).length + bodyBytes !== length) length = String(length).length + bodyBytes;
  return `${length}${body}`;
}

/**
 * Writes a ustar archive byte by byte, so tests can build archives no well-behaved tar
 * program would: absolute paths, "..", links out of the tree, device nodes, names of any length.
 */
export function tarArchive(entries: TestTarEntry[], options: { gzip?: boolean } = {}): Buffer {
  const blocks: Buffer[] = [];
  for (const entry of entries) {
    const type = entry.type ?? 'file';
    const data = type === 'file' ? Buffer.from(entry.data ?? '') : Buffer.alloc(0);
    const mode = entry.mode ?? (type === 'dir' ? 0o755 : 0o644);
    const linkTarget = entry.linkTarget ?? '';
    // a NUL byte would end the header's field: such names need an extension header too
    const longPath = Buffer.byteLength(entry.path) > 100 || entry.path.includes('\0');
    const longLink = Buffer.byteLength(linkTarget) > 100 || linkTarget.includes('\0');
    if ((longPath || longLink) && entry.longNames === 'gnu') {
      if (longPath) blocks.push(...record('././@LongLink', 'L', Buffer.from(`${entry.path}\0`), { mode: 0 }));
      if (longLink) blocks.push(...record('././@LongLink', 'K', Buffer.from(`${linkTarget}\0`), { mode: 0 }));
    } else if (longPath || longLink) {
      const records = `${longPath ? paxRecord('path', entry.path) : ''}${longLink ? paxRecord('linkpath', linkTarget) : ''}`;
      blocks.push(...record('PaxHeader', 'x', Buffer.from(records), { mode: 0o644 }));
    }
    blocks.push(...record(entry.path, FLAGS[type], data, { mode, linkTarget }));
  }
  blocks.push(Buffer.alloc(1024));
  const archive = Buffer.concat(blocks);
  return options.gzip ? gzipSync(archive) : archive;
}
