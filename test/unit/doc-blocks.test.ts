import { describe, expect, it } from 'vitest';
import { allDocSamples, docSamples } from '../support/doc-blocks.ts';

const PAGE = [
  '# A page',
  '',
  '```sh runnable serves=127.0.0.1:7100',
  'sandgym node --listen 127.0.0.1:7100 &',
  '```',
  '',
  '```json',
  '{ "not": "a sample" }',
  '```',
  '',
  '````ts no-run needs a cluster',
  "const x = '```';",
  '````',
  '',
  '```python runnable',
  'print(1)',
  '```',
].join('\n');

describe('doc samples', () => {
  it('reads each sample with its language, its marker and the line of its fence', () => {
    expect(docSamples('p.md', PAGE)).toEqual([
      {
        page: 'p.md',
        line: 3,
        language: 'sh',
        runnable: true,
        serves: '127.0.0.1:7100',
        code: 'sandgym node --listen 127.0.0.1:7100 &\n',
      },
      {
        page: 'p.md',
        line: 11,
        language: 'ts',
        runnable: false,
        reason: 'needs a cluster',
        code: "const x = '```';\n",
      },
      { page: 'p.md', line: 15, language: 'python', runnable: true, code: 'print(1)\n' },
    ]);
  });

  it('refuses a sample that does not say whether it runs, naming its place', () => {
    expect(() => docSamples('p.md', 'text\n\n```ts\nlet a = 1;\n```\n')).toThrow(/^p\.md:3: mark the block/);
    expect(() => docSamples('p.md', '```sh no-run\nls\n```\n')).toThrow(/^p\.md:1: .*no-run REASON/);
    expect(() => docSamples('p.md', '```sh runnable serves\nls\n```\n')).toThrow(/^p\.md:1:/);
    expect(() => docSamples('p.md', '```sh runnable\nls\n')).toThrow(/^p\.md:1: code block is never closed/);
  });

  it('finds every sample of README.md, docs/ and python/README.md marked', async () => {
    const samples = await allDocSamples('.');
    const pages = new Set(samples.map((sample) => sample.page));
    expect([...pages]).toEqual(expect.arrayContaining(['README.md', 'docs/cluster.md', 'python/README.md']));
    expect(samples.filter((sample) => sample.runnable).length).toBeGreaterThan(0);
  });
});
