import { gzipSync } from 'node:zlib';

/** One entry of a test archive. */
export interface TestTarEntry {
  path: string;
  type?: 'file' | 'dir' | 'symlink' | 'hardlink' | 'char';
  data?: string | Buffer;
  linkTarget?: string;
  mode?: number;
}

const FLAGS = { file: '0', hardlink: '1', symlink: '2', char: '3', dir: '5' } as const;

function field(block: Buffer, offset: number, length: number, value: string): void {
  block.write(value.slice(0, length), offset, length, 'utf8');
}

function octal(block: Buffer, offset: number, length: number, value: number): void {
  field(block, offset, length, `${value.toString(8).padStart(length - 1, '0')}\0`);
}

/**
 * Writes a ustar archive byte by byte, so tests can build archives no well-behaved tar
 * program would: absolute paths, "..", links out of the tree, device nodes.
 */
export function tarArchive(entries: TestTarEntry[], options: { gzip?: boolean } = {}): Buffer {
  const blocks: Buffer[] = [];
  for (const entry of entries) {
    const type = entry.type ?? 'file';
    const data = type === 'file' ? Buffer.from(entry.data ?? '') : Buffer.alloc(0);
    const header = Buffer.alloc(512);
    field(header, 0, 100, entry.path);
    octal(header, 100, 8, entry.mode ?? (type === 'dir' ? 0o755 : 0o644));
    octal(header, 108, 8, 0);
    octal(header, 116, 8, 0);
    octal(header, 124, 12, data.length);
    octal(header, 136, 12, 1_700_000_000);
    field(header, 156, 1, FLAGS[type]);
    field(header, 157, 100, entry.linkTarget ?? '');
    field(header, 257, 6, 'ustar\0');
    field(header, 263, 2, '00');
    header.fill(0x20, 148, 156);
    let sum = 0;
    for (const byte of header) sum += byte;
    field(header, 148, 8, `${sum.toString(8).padStart(6, '0')}\0 `);
    blocks.push(header, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  const archive = Buffer.concat(blocks);
  return options.gzip ? gzipSync(archive) : archive;
}
