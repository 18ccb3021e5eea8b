/**
 * The code blocks of the docs, as the doc test (test/system/doc-samples.test.ts) reads them. A
 * shell, TypeScript or Python block says in its fence whether it runs (CONTRIBUTING.md has the
 * markers): `runnable`, optionally with `serves=HOST:PORT`, or `no-run REASON`. An unmarked block
 * is an error, so a new sample cannot dodge the test by saying nothing. Other blocks (JSON,
 * output, unlabelled) are not samples and are left alone.
 */

import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';

export type SampleLanguage = 'sh' | 'ts' | 'python';

const LANGUAGES: Record<string, SampleLanguage> = {
  sh: 'sh',
  bash: 'sh',
  shell: 'sh',
  ts: 'ts',
  typescript: 'ts',
  python: 'python',
  py: 'python',
};

export interface DocSample {
  /** The page, relative to the checkout (`docs/cluster.md`). */
  page: string;
  /** 1-based line of the opening fence, so `page:line` points at it. */
  line: number;
  language: SampleLanguage;
  /** Whether the doc test runs it; when not, `reason` says why. */
  runnable: boolean;
  reason?: string;
  /** `host:port` a runnable block leaves a server listening on. */
  serves?: string;
  code: string;
}

/** `page:line`, the place a failure names. */
export function where(sample: Pick<DocSample, 'page' | 'line'>): string {
  return `${sample.page}:${sample.line}`;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`]*)$/;

/** The samples of one page, in order; throws naming `page:line` for a sample without a valid marker. */
export function docSamples(page: string, text: string): DocSample[] {
  const samples: DocSample[] = [];
  const lines = text.split('\n');
  for (let index = 0; index < lines.length; index++) {
    const open = FENCE.exec(lines[index]!);
    if (!open) continue;
    const [, fence, info] = open as unknown as [string, string, string];
    const body: string[] = [];
    let end = index + 1;
    while (end < lines.length && lines[end]!.trim() !== fence) body.push(lines[end++]!);
    if (end === lines.length) throw new Error(`${page}:${index + 1}: code block is never closed`);
    const [word = '', ...rest] = info.trim().split(/\s+/);
    const language = LANGUAGES[word.toLowerCase()];
    if (language) {
      samples.push({
        page,
        line: index + 1,
        language,
        code: `${body.join('\n')}\n`,
        ...marker(rest, index + 1),
      });
    }
    index = end;
  }
  return samples;

  function marker(words: string[], line: number): Pick<DocSample, 'runnable' | 'reason' | 'serves'> {
    const [kind, ...rest] = words;
    if (kind === 'no-run' && rest.length > 0) return { runnable: false, reason: rest.join(' ') };
    if (kind === 'runnable' && rest.length === 0) return { runnable: true };
    const serves = /^serves=(\S+:\d+)$/.exec(rest[0] ?? '')?.[1];
    if (kind === 'runnable' && rest.length === 1 && serves) return { runnable: true, serves };
    throw new Error(
      `${page}:${line}: mark the block \`runnable\` (optionally \`serves=HOST:PORT\`) or \`no-run REASON\`, not "${words.join(' ')}"`,
    );
  }
}

/** The pages a fresh clone follows (README.md, docs/*.md, python/README.md), relative to `root`. */
export async function docPages(root: string): Promise<string[]> {
  const docs = (await readdir(join(root, 'docs'))).filter((name) => name.endsWith('.md')).sort();
  return ['README.md', ...docs.map((name) => `docs/${name}`), 'python/README.md'];
}

/** Every page's samples, in page order. */
export async function allDocSamples(root: string): Promise<DocSample[]> {
  const pages = await docPages(root);
  const texts = await Promise.all(pages.map((page) => readFile(join(root, page), 'utf8')));
  return pages.flatMap((page, index) => docSamples(page, texts[index]!));
}
