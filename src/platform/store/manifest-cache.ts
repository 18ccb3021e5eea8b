import { readFile, stat } from 'node:fs/promises';

/**
 * Parsed JSON manifests by path, read again only when the file changed: a new inode (manifests
 * are written by rename), modification time or size. An environment's manifest is read on every
 * create and written rarely, so a create costs one stat instead of a read and a parse. Each
 * caller gets its own copy, free to change.
 */
export class ManifestCache<T> {
  private readonly entries = new Map<string, { version: string; value: T }>();

  constructor(private readonly parse: (json: unknown, path: string) => T) {}

  /** The manifest at `path`, or undefined when there is no such file. */
  async read(path: string): Promise<T | undefined> {
    let version: string;
    try {
      const info = await stat(path, { bigint: true });
      version = `${info.ino}:${info.mtimeNs}:${info.size}`;
    } catch {
      return undefined;
    }
    let entry = this.entries.get(path);
    if (entry?.version !== version) {
      const text = await readFile(path, 'utf8').catch(() => undefined);
      if (text === undefined) return undefined;
      // a file replaced between the stat and the read is read again next time: its version differs
      entry = { version, value: this.parse(JSON.parse(text), path) };
      this.entries.set(path, entry);
    }
    return structuredClone(entry.value);
  }
}
