import { existsSync, readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = resolve(import.meta.dirname, '..', '..');
// what is installed or built, not written here: npm's and the harness venv's packages, outputs
const SKIPPED = new Set(['node_modules', '.venv', 'dist', '.sandgym', '.git', 'build']);

/** Files of the repository with one of `extensions`, outside what is built or installed. */
function filesOf(dir: string, extensions: string[]): string[] {
  return readdirSync(dir).flatMap((name) => {
    if (SKIPPED.has(name)) return [];
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return filesOf(path, extensions);
    return extensions.some((ext) => name.endsWith(ext)) ? [path] : [];
  });
}

/** GitHub's anchor of a heading: lowercase, punctuation dropped, spaces as dashes. */
function slug(heading: string): string {
  return heading
    .toLowerCase()
    .replace(/[`*_]/g, '')
    .replace(/[^\p{L}\p{N} -]/gu, '')
    .replace(/ /g, '-');
}

function anchorsOf(markdown: string): Set<string> {
  return new Set([...markdown.matchAll(/^#+ (.+)$/gm)].map((m) => slug(m[1]!.trim())));
}

describe('the documentation', () => {
  it('links only to files and headings that exist in the repository, or to web pages', () => {
    const broken: string[] = [];
    for (const file of filesOf(ROOT, ['.md'])) {
      const text = readFileSync(file, 'utf8');
      for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        if (!target || /^(https?:|mailto:)/.test(target)) continue;
        const [path = '', anchor] = target.split('#');
        const resolved = path ? resolve(dirname(file), path) : file;
        const where = `${relative(ROOT, file)} -> ${target}`;
        if (relative(ROOT, resolved).startsWith('..')) broken.push(`${where}: outside the repository`);
        else if (!existsSync(resolved)) broken.push(`${where}: no such file`);
        else if (anchor && resolved.endsWith('.md') && !anchorsOf(readFileSync(resolved, 'utf8')).has(anchor))
          broken.push(`${where}: no such heading`);
      }
    }
    expect(broken).toEqual([]);
  });

  it('never points readers outside the repository in code, comments or docs', () => {
    const outside = filesOf(ROOT, ['.md', '.ts', '.py', '.sh', '.mjs', '.json', '.c', '.h'])
      .filter((file) => file !== resolve(import.meta.filename))
      .filter((file) => /\.\.\/shared\b/.test(readFileSync(file, 'utf8')))
      .map((file) => relative(ROOT, file));
    expect(outside).toEqual([]);
  });

  it('names only Markdown pages the repository holds, in code and comments too', () => {
    const pages = new Set(filesOf(ROOT, ['.md']).map((file) => file.split('/').pop()));
    const missing: string[] = [];
    for (const file of filesOf(ROOT, ['.ts', '.py', '.sh', '.mjs', '.c', '.h'])) {
      if (file === resolve(import.meta.filename)) continue;
      // what a reader is pointed to: comments and test titles (a test's own files are data)
      const prose = readFileSync(file, 'utf8')
        .split('\n')
        .filter((line) => /^\s*(\/\/|\/?\*|#)|\b(it|describe)\(/.test(line));
      for (const line of prose) {
        for (const [name] of line.matchAll(/\b[\w-]+\.md\b/g)) {
          if (!pages.has(name)) missing.push(`${relative(ROOT, file)}: ${name}`);
        }
      }
    }
    expect(missing).toEqual([]);
  });
});
