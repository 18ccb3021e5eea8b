import { createHash } from 'node:crypto';
import { lstat, readFile, readdir, readlink, realpath } from 'node:fs/promises';
import { join, relative, resolve, sep } from 'node:path';
import { SandgymError, isSandgymError, readRegularFile, resolveBeneath } from '../../common/index.ts';
import { fail } from './dockerfile-parse.ts';
import { compileGlob, type PathGlob } from './glob-match.ts';

/** One `.dockerignore` line: a path pattern, and whether it excludes or (with `!`) brings back. */
interface IgnoreRule {
  pattern: PathGlob;
  exclude: boolean;
}

function hasGlob(path: string): boolean {
  return /[*?[]/.test(path);
}

/** Tidies a pattern or source as Docker does: no leading `/` or `./`, no trailing `/`. */
function clean(path: string): string {
  return path
    .split('/')
    .filter((part) => part !== '' && part !== '.')
    .join('/');
}

/**
 * A build context: the folder COPY and ADD read from, with its `.dockerignore`. Every path it
 * hands out is real (symlinks resolved) and inside the context: a source that leads out, by `..`
 * or through a link, is refused naming the Dockerfile line.
 */
export class BuildContext {
  private constructor(
    readonly root: string,
    private readonly rules: IgnoreRule[],
  ) {}

  static async open(dir: string): Promise<BuildContext> {
    const root = await realpath(resolve(dir)).catch((error: unknown) => {
      throw new SandgymError('invalid_argument', `The build context ${dir} does not exist`, { cause: error });
    });
    // the ignore file is the context's own: a symlink out of it, a FIFO or a folder is refused
    const ignoreFile = await resolveBeneath(root, '.dockerignore', "The build context's .dockerignore");
    const what = `The build context's .dockerignore (${join(root, '.dockerignore')})`;
    const bytes = await readRegularFile(ignoreFile, what, { missing: 'undefined' });
    const text = bytes?.toString('utf8') ?? '';
    const rules = text
      .split('\n')
      .map((line) => line.trim())
      .filter((line) => line && !line.startsWith('#'))
      .map((line) => {
        const exclude = !line.startsWith('!');
        return { pattern: compileGlob(clean(exclude ? line : line.slice(1))), exclude };
      });
    return new BuildContext(root, rules);
  }

  /** Whether `.dockerignore` leaves a context path (relative) out: the last rule it matches decides. */
  isIgnored(rel: string): boolean {
    if (rel === '' || rel === '.dockerignore' || rel === 'Dockerfile') return false;
    let ignored = false;
    const parts = rel.split('/');
    for (const rule of this.rules) {
      // a rule matching a folder covers everything below it
      for (let depth = 1; depth <= parts.length; depth++) {
        if (rule.pattern.test(parts.slice(0, depth).join('/'))) {
          ignored = rule.exclude;
          break;
        }
      }
    }
    return ignored;
  }

  /** The context's real paths a COPY/ADD source names: itself, or every match of its glob. */
  async sources(file: string, line: number, source: string): Promise<string[]> {
    const rel = clean(source);
    if (!hasGlob(rel)) return [await this.inside(file, line, source, rel)];
    const pattern = compileGlob(rel);
    const matches: string[] = [];
    const walk = async (dir: string): Promise<void> => {
      for (const entry of await readdir(join(this.root, dir), { withFileTypes: true })) {
        const path = dir ? `${dir}/${entry.name}` : entry.name;
        if (this.isIgnored(path)) continue;
        if (pattern.test(path)) matches.push(await this.inside(file, line, source, path));
        else if (entry.isDirectory() && !entry.isSymbolicLink()) await walk(path);
      }
    };
    await walk('');
    if (matches.length === 0) fail(file, line, `no file in the build context matches "${source}"`);
    return matches.sort();
  }

  /** A context path, resolved, checked to stay inside the context. */
  private async inside(file: string, line: number, source: string, rel: string): Promise<string> {
    const outside = (): never =>
      fail(
        file,
        line,
        `"${source}" is outside the build context ${this.root}: COPY and ADD take only files inside it (a symlink may not lead out)`,
      );
    // the one resolver of paths someone else wrote: a link out is refused before its target is
    // looked up, so whether a host path exists never shows in the error
    let real: string;
    try {
      real = await resolveBeneath(this.root, rel, 'COPY/ADD source');
    } catch (error) {
      if (isSandgymError(error, 'invalid_argument')) outside();
      throw error;
    }
    await lstat(real).catch((error: unknown) => {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT')
        fail(file, line, `COPY/ADD source ${source} does not exist in the build context ${this.root}`);
      throw error;
    });
    if (this.isIgnored(relative(this.root, real).split(sep).join('/')))
      fail(file, line, `COPY/ADD source ${source} is excluded by .dockerignore`);
    return real;
  }

  /** Whether a real context path is kept (not ignored): the filter COPY applies under a folder. */
  keeps(path: string): boolean {
    const rel = relative(this.root, path).split(sep).join('/');
    return rel.startsWith('..') || !this.isIgnored(rel);
  }

  /** A digest of what COPY/ADD would take from these paths, so an edit to any of them misses the cache. */
  async digest(paths: readonly string[]): Promise<string> {
    const digest = createHash('sha256');
    const walk = async (path: string): Promise<void> => {
      if (!this.keeps(path)) return;
      const info = await lstat(path);
      digest.update(`${relative(this.root, path)}\0${info.mode}\0`);
      if (info.isSymbolicLink()) digest.update(await readlink(path));
      else if (info.isFile()) digest.update(await readFile(path));
      else if (info.isDirectory())
        for (const child of (await readdir(path)).sort()) await walk(join(path, child));
    };
    for (const path of paths) await walk(path);
    return digest.digest('hex');
  }
}
