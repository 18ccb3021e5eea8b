/** One entry of an initramfs archive. */
export interface CpioEntry {
  path: string;
  kind: 'file' | 'dir';
  data?: Uint8Array;
  mode?: number;
}

const S_IFREG = 0o100000;
const S_IFDIR = 0o040000;

function padding(length: number): Buffer {
  return Buffer.alloc((4 - (length % 4)) % 4);
}

/**
 * A "newc" cpio archive, the format the kernel unpacks as an initramfs. Archives concatenate:
 * the kernel unpacks one after the other, so a per-VM archive can follow a shared one.
 */
export function cpioArchive(entries: readonly CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  let inode = 1;
  const add = (path: string, mode: number, data: Uint8Array): void => {
    const name = Buffer.from(`${path}\0`);
    const fields = [inode++, mode, 0, 0, 1, 0, data.length, 0, 0, 0, 0, name.length, 0];
    const header = Buffer.from(`070701${fields.map((v) => v.toString(16).padStart(8, '0')).join('')}`);
    parts.push(header, name, padding(header.length + name.length), Buffer.from(data), padding(data.length));
  };
  for (const entry of entries) {
    const type = entry.kind === 'dir' ? S_IFDIR : S_IFREG;
    add(
      entry.path.replace(/^\/+/, ''),
      type | (entry.mode ?? (entry.kind === 'dir' ? 0o755 : 0o644)),
      entry.data ?? new Uint8Array(),
    );
  }
  add('TRAILER!!!', 0, new Uint8Array());
  return Buffer.concat(parts);
}
