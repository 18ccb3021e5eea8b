import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runProgram } from '../../src/backends/index.ts';
import { writtenUnder } from '../../src/backends/host/written-paths.ts';

/** The protected prefixes a task's steps are audited for, as grading gives them. */
const PROTECTED = [
  '/tests',
  '/logs/verifier',
  '/usr/bin',
  '/usr/lib',
  '/etc/ld.so.preload',
  '/sandgym-runner',
];

describe('writtenUnder: what an upper dir holds under protected prefixes', () => {
  let upper: string;
  beforeEach(async () => {
    upper = await mkdtemp(join(tmpdir(), 'written-'));
  });
  afterEach(async () => {
    await rm(upper, { recursive: true, force: true });
  });

  const put = async (path: string, text = 'x'): Promise<void> => {
    await mkdir(join(upper, path, '..'), { recursive: true });
    await writeFile(join(upper, path), text);
  };

  it('finds nothing where the sandbox wrote only outside them', async () => {
    await put('app/hello.txt');
    await put('etc/hosts');
    await put('usr/local/lib/x.so');
    expect(await writtenUnder(upper, PROTECTED, 256)).toEqual([]);
  });

  it('lists files, empty folders and deletions below a prefix, and the prefix file itself', async () => {
    await put('usr/lib/python3/evil.py');
    await mkdir(join(upper, 'tests/empty'), { recursive: true });
    await put('etc/ld.so.preload');
    // an overlay whiteout: the deletion of /usr/bin/python3
    await mkdir(join(upper, 'usr/bin'), { recursive: true });
    await runProgram('mknod', [join(upper, 'usr/bin/python3'), 'c', '0', '0']);
    expect(await writtenUnder(upper, PROTECTED, 256)).toEqual([
      '/etc/ld.so.preload',
      '/tests/empty',
      '/usr/bin/python3',
      '/usr/lib/python3/evil.py',
    ]);
  });

  it('reports a link or file in place of a prefix folder, or of a folder above it, without following it', async () => {
    const outside = await mkdtemp(join(tmpdir(), 'written-outside-'));
    try {
      await writeFile(join(outside, 'planted'), 'x');
      await symlink(outside, join(upper, 'tests'));
      await mkdir(join(upper, 'logs'), { recursive: true });
      await writeFile(join(upper, 'logs/verifier'), 'not a folder');
      await writeFile(join(upper, 'usr'), 'a file where /usr was');
      expect(await writtenUnder(upper, PROTECTED, 256)).toEqual(['/logs/verifier', '/tests', '/usr']);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });

  it('counts nested and repeated prefixes once, skips bytecode caches, and stops at the limit', async () => {
    await put('usr/lib/a');
    await put('usr/lib/python3/b');
    await put('usr/lib/python3/__pycache__/c.pyc');
    expect(await writtenUnder(upper, ['/usr/lib', '/usr/lib/python3', '/usr/lib'], 256)).toEqual([
      '/usr/lib/a',
      '/usr/lib/python3/b',
    ]);
    // a flood under one prefix takes only its share of the limit: the other stays reported
    for (let i = 0; i < 10; i++) await put(`tests/f${i}`);
    const capped = await writtenUnder(upper, PROTECTED, 3);
    expect(capped.length).toBeLessThanOrEqual(3);
    expect(capped.filter((path) => path.startsWith('/tests/'))).toHaveLength(1);
    expect(capped.filter((path) => path.startsWith('/usr/lib/'))).toHaveLength(1);
  });

  it('reports what is in a bytecode cache but bytecode, and a chain of folders deeper than it walks', async () => {
    await put('usr/lib/python3/__pycache__/ok.cpython-311.pyc');
    await put('usr/lib/python3/__pycache__/evil.py');
    let deep = 'tests';
    for (let i = 0; i < 100; i++) deep += '/d';
    await put(`${deep}/leaf`);
    const written = await writtenUnder(upper, PROTECTED, 256);
    expect(written).toContain('/usr/lib/python3/__pycache__/evil.py');
    expect(written.some((path) => path.endsWith('.pyc'))).toBe(false);
    // the folder at the walk's depth stands for what is below it
    expect(written.filter((path) => path.startsWith('/tests/'))).toEqual([`/${'tests' + '/d'.repeat(64)}`]);
  });

  it('takes the root as a prefix to mean everything, and an upper dir that is gone as nothing', async () => {
    await put('a/b');
    await put('c');
    expect(await writtenUnder(upper, ['/'], 256)).toEqual(['/a/b', '/c']);
    expect(await writtenUnder(join(upper, 'missing'), PROTECTED, 256)).toEqual([]);
  });
});
