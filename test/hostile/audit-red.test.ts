import { spawn } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { mkdir, mkdtemp, rm, stat, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { runProgram } from '../../src/backends/index.ts';
import { filterDiffTree, type DiffTree } from '../../src/backends/host/diff-filter.ts';
import { writtenUnder } from '../../src/backends/host/written-paths.ts';
import { PROTECTED_PATHS } from '../../src/env/index.ts';
import { BASE_SCOPE } from '../../src/env/grading-scope.ts';
import { attack } from './summary.ts';

/**
 * Second attacker on the two functions that say what an agent's sandbox changed: the step audit
 * (writtenUnder, behind info.signals.protectedChanges) and the grader's diff filter
 * (filterDiffTree, behind an episode's `tampered` and what its grader's sandbox holds). Here the
 * upper dir is built on the host the way overlayfs represents what an agent did (whiteouts as 0:0
 * character devices, trusted.overlay.opaque folders), which is sharper than going through a
 * sandbox; audit-red-sandbox.test.ts plays the same attacks from inside real sandboxes.
 * `it.fails` with `OPEN BREAK:` marks a break that is known and not closed yet (docs/security.md,
 * "Open breaks").
 */

/** An overlay opaque mark, as overlayfs sets it when a sandbox makes a folder it had emptied. */
async function markOpaque(dir: string): Promise<void> {
  await runProgram('setfattr', ['-n', 'trusted.overlay.opaque', '-v', 'y', dir]);
}

/** An overlay whiteout at `path`: the sandbox deleted what the layers below held there. */
async function whiteout(path: string): Promise<void> {
  await runProgram('mknod', [path, 'c', '0', '0']);
}

describe('step audit (writtenUnder) under attack', () => {
  let upper: string;
  beforeEach(async () => {
    upper = await mkdtemp(join(tmpdir(), 'audit-red-'));
  });
  afterEach(async () => {
    // coreutils rm walks by fd, so it removes chains deeper than PATH_MAX too
    await runProgram('rm', ['-rf', upper]);
  });

  const put = async (path: string, text = 'x'): Promise<void> => {
    await mkdir(join(upper, path, '..'), { recursive: true });
    await writeFile(join(upper, path), text);
  };

  it.fails(
    'OPEN BREAK: reports protected folders an opaque ancestor deleted (rm -rf /usr/local; mkdir /usr/local)',
    () =>
      attack('audit', 'opaque ancestor hides a deleted protected folder', async () => {
        // what overlayfs leaves: /usr copied up, /usr/local emptied and made again, so the lower's
        // /usr/local/bin and /usr/local/sbin are gone from the sandbox
        await mkdir(join(upper, 'usr/local/lib'), { recursive: true });
        await markOpaque(join(upper, 'usr/local'));
        // the same one level up: /logs/verifier of the layers below is hidden by an opaque /logs
        await mkdir(join(upper, 'logs/agent'), { recursive: true });
        await markOpaque(join(upper, 'logs'));
        const written = await writtenUnder(upper, PROTECTED_PATHS, 256);
        expect(written).toEqual(expect.arrayContaining(['/usr/local/bin', '/logs/verifier']));
      }),
  );

  it('honest twin: an opaque folder away from every prefix is not reported', async () => {
    await mkdir(join(upper, 'app/build'), { recursive: true });
    await markOpaque(join(upper, 'app'));
    expect(await writtenUnder(upper, PROTECTED_PATHS, 256)).toEqual([]);
  });

  it('reports a whiteout or a FIFO in place of a prefix folder or of an ancestor, and never blocks on it', () =>
    attack('audit', 'whiteout and FIFO in place of folders', async () => {
      await whiteout(join(upper, 'logs'));
      await mkdir(join(upper, 'usr'));
      await runProgram('mkfifo', [join(upper, 'usr/local'), join(upper, 'tests')]);
      await whiteout(join(upper, 'usr/lib'));
      expect(await writtenUnder(upper, PROTECTED_PATHS, 256)).toEqual([
        '/logs',
        '/tests',
        '/usr/lib',
        '/usr/local',
      ]);
    }));

  it('BREAK: a folder named __pycache__ hides any file below a prefix, not only bytecode', () =>
    attack('audit', '__pycache__ folder as a hiding place', async () => {
      // no interpreter writes a shared library or a folder of scripts into a bytecode cache
      await put('usr/lib/x86_64-linux-gnu/__pycache__/libc.so.6', 'forged');
      await put('usr/bin/__pycache__/python3', '#!/bin/sh\necho forged\n');
      const written = await writtenUnder(upper, PROTECTED_PATHS, 256);
      expect(written).toEqual(
        expect.arrayContaining([
          '/usr/lib/x86_64-linux-gnu/__pycache__/libc.so.6',
          '/usr/bin/__pycache__/python3',
        ]),
      );
    }));

  it('BREAK: a flood under the first prefix keeps a later prefix from ever being reported', () =>
    attack('audit', 'limit flood masks later prefixes', async () => {
      // step 1 writes 300 files under /tests (one tamper signal); every later write under /bin,
      // /usr/lib or /etc/ld.so.preload sorts after the 256 that fill the limit, and never shows
      for (let i = 0; i < 300; i++) await put(`tests/f${String(i).padStart(3, '0')}`);
      await put('etc/ld.so.preload', '/tmp/evil.so\n');
      await put('usr/bin/python3', 'forged');
      const written = await writtenUnder(upper, PROTECTED_PATHS, 256);
      expect(written).toEqual(expect.arrayContaining(['/etc/ld.so.preload', '/usr/bin/python3']));
    }));

  it('names that are not UTF-8 are reported, folders with them too', () =>
    attack('audit', 'non-UTF-8 names below a prefix', async () => {
      const tests = Buffer.from(join(upper, 'tests'));
      await mkdir(tests, { recursive: true });
      const bad = Buffer.concat([tests, Buffer.from('/bad\xff', 'latin1')]);
      await mkdir(bad);
      await writeFile(Buffer.concat([bad, Buffer.from('/inner')]), 'x');
      const written = await writtenUnder(upper, ['/tests'], 256);
      expect(written).toHaveLength(1);
      expect(written[0]).toMatch(/^\/tests\/bad/);
    }));

  it('never follows a folder swapped for a link to a host folder while it walks', () =>
    attack('audit', 'dir/symlink swap race during the walk', async () => {
      // a host folder full of names the upper dir never holds
      const host = await mkdtemp(join(tmpdir(), 'audit-red-host-'));
      try {
        for (let i = 0; i < 50; i++) await writeFile(join(host, `HOSTFILE${i}`), 'secret');
        const swapped = join(upper, 'tests/d');
        await mkdir(swapped, { recursive: true });
        for (let i = 0; i < 50; i++) await writeFile(join(swapped, `own${i}`), 'x');
        await mkdir(join(upper, 'tests/d.real'));
        // a process of the sandbox's that swaps /tests/d between its folder and a link, nonstop
        const swapper = spawn(
          'sh',
          [
            '-c',
            `cd "$1/tests" && ln -s "$2" link && while :; do mv -T link d.tmp; mv -T d d.real2; mv -T d.tmp d; mv -T d d.tmp; mv -T d.real2 d; done 2>/dev/null`,
            'swapper',
            upper,
            host,
          ],
          { stdio: 'ignore' },
        );
        try {
          // until the walk has met the link in /tests/d's place (reported as itself) a few times
          let metLink = 0;
          for (let round = 0; round < 5000 && metLink < 20; round++) {
            const written = await writtenUnder(upper, ['/tests'], 4096);
            expect(written.filter((path) => path.includes('HOSTFILE'))).toEqual([]);
            if (written.includes('/tests/d')) metLink++;
          }
          expect(metLink).toBe(20);
        } finally {
          swapper.kill('SIGKILL');
        }
      } finally {
        await rm(host, { recursive: true, force: true });
      }
    }));

  it('BREAK: never lists a folder of the agent that only leads to the prefixes (/etc, /usr, /)', () =>
    attack('audit', 'audit cost grows with files outside the prefixes', async () => {
      // Each step's audit lists the upper dir's /, /usr, /usr/local, /etc, /root and /logs in
      // full to find the few prefix names there: a million empty files the agent leaves in /etc
      // made every audit of its steps take 3-4 s, stall the node's event loop 1.6-2.6 s and add
      // ~150 MiB to its heap on this machine, where a lookup per prefix costs nothing. A folder
      // that is listed gets its access time updated (relatime: while it is older than the
      // change), so the listing shows without a clock.
      const etc = join(upper, 'etc');
      await mkdir(etc);
      for (let i = 0; i < 2000; i++) await writeFile(join(etc, `junk${i}`), '');
      const control = await mkdtemp(join(upper, 'control-'));
      const old = new Date('2000-01-01T00:00:00Z');
      const listedSince = async (dir: string): Promise<boolean> => (await stat(dir)).atimeMs > old.getTime();
      await utimes(control, old, new Date());
      readdirSync(control);
      // a filesystem that keeps no access times cannot show a listing: then this proves nothing
      expect(await listedSince(control), 'this filesystem keeps access times').toBe(true);
      await utimes(etc, old, new Date());
      expect(await writtenUnder(upper, PROTECTED_PATHS, 256)).toEqual([]);
      expect(await listedSince(etc)).toBe(false);
    }));

  it('BREAK: holds a bounded number of descriptors, whatever the depth of a chain of folders', () =>
    attack('audit', 'deep folder chain exhausts the node process descriptors', async () => {
      // a chain 2000 deep under /tests costs the agent a few MB; the walk holds a folder open for
      // each level it is in, so the node process's descriptor limit is the agent's to spend
      await runProgram('python3', [
        '-c',
        'import os,sys\nos.chdir(sys.argv[1])\nfor _ in range(2000):\n  os.mkdir("a"); os.chdir("a")\nopen("leaf","w").close()',
        await mkdir(join(upper, 'tests'), { recursive: true }).then(() => join(upper, 'tests')),
      ]);
      const openNow = (): number => readdirSync('/proc/self/fd').length;
      const before = openNow();
      let peak = before;
      let walking = true;
      const sample = (): void => {
        peak = Math.max(peak, openNow());
        if (walking) setImmediate(sample);
      };
      setImmediate(sample);
      const written = await writtenUnder(upper, PROTECTED_PATHS, 256).finally(() => (walking = false));
      // the walk stops 64 levels down and reports the folder there, which stands for the leaf
      expect(written).toHaveLength(1);
      expect(written[0]).toMatch(/^\/tests(\/a){64}$/);
      expect(peak - before).toBeLessThan(256);
    }));
});

describe('grader diff filter (filterDiffTree) under attack', () => {
  let root: string;
  let copy: DiffTree;
  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'diff-red-'));
    await mkdir(join(root, 'tree'));
    copy = {
      tree: join(root, 'tree'),
      trash: join(root, 'trash'),
      // what the node's helper does: remove the mark, say which folders had it
      async clearOpaque(dirs) {
        const had: string[] = [];
        for (const dir of dirs) {
          const removed = await runProgram('setfattr', ['-x', 'trusted.overlay.opaque', dir]).then(
            () => true,
            () => false,
          );
          if (removed) had.push(dir);
        }
        return had;
      },
      // no layers below in a unit test: links resolve within the copy alone, as documented
      withMergedView: (consume) => consume(join(root, 'tree')),
    };
  });
  afterEach(async () => {
    await runProgram('rm', ['-rf', root]);
  });

  const put = async (path: string, text = 'x'): Promise<void> => {
    await mkdir(join(copy.tree, path, '..'), { recursive: true });
    await writeFile(join(copy.tree, path), text);
  };
  const left = (): string[] =>
    readdirSync(copy.tree, { recursive: true, encoding: 'utf8' })
      .map((p) => p.toString())
      .sort();

  it('takes out excluded paths and every stand-in for one, and reports each as tampering', () =>
    attack('diff', 'stand-ins for excluded paths', async () => {
      await symlink('/tmp', join(copy.tree, 'tests')); // a link in place of /tests
      await mkdir(join(copy.tree, 'usr'));
      await writeFile(join(copy.tree, 'usr/local'), 'a file in place of /usr/local'); // ancestor file
      await mkdir(join(copy.tree, 'logs'));
      await whiteout(join(copy.tree, 'logs/verifier')); // the reward folder deleted
      await mkdir(join(copy.tree, 'etc'));
      await markOpaque(join(copy.tree, 'etc')); // /etc emptied and made again
      await put('etc/hostname', 'work');
      await put('app/out.txt', 'work');
      const report = await filterDiffTree(copy, BASE_SCOPE);
      expect(left()).toEqual(['app', 'app/out.txt', 'etc', 'etc/hostname', 'logs', 'usr']);
      expect(report.present).toEqual(
        expect.arrayContaining(['tests', 'usr/local/bin', 'logs/verifier', 'etc/ld.so.preload']),
      );
      // the opaque mark is gone, so the task's /etc/ld.so.* show through again
      await expect(
        runProgram('getfattr', ['-n', 'trusted.overlay.opaque', join(copy.tree, 'etc')]),
      ).rejects.toThrow();
    }));

  it('BREAK: lists a bounded number of dropped entries, however many FIFOs the agent made', () =>
    attack('diff', 'dropped-entry flood', async () => {
      // each FIFO costs the agent one inode; each becomes an entry of the episode's report
      await runProgram('python3', [
        '-c',
        'import os,sys\nfor i in range(30000): os.mkfifo(os.path.join(sys.argv[1], "f%d" % i))',
        copy.tree,
      ]);
      const report = await filterDiffTree(copy, BASE_SCOPE);
      expect(left()).toEqual([]);
      expect(report.dropped.length).toBeLessThanOrEqual(10_000);
    }));

  it('leaves links into hidden folders out, magic links and loops too', () =>
    attack('diff', 'links into hidden folders', async () => {
      await mkdir(join(copy.tree, 'app'));
      const links: Record<string, string> = {
        a: '/tests/expected.txt',
        b: '../tests',
        c: '/proc/thread-self/root/tests/x',
        d: '/proc/self/task/../cwd/x',
        e: '/dev/../dev/fd/3',
        f: 'g',
        g: 'f',
        h: 'dir/../../logs/verifier/reward.txt',
      };
      for (const [name, target] of Object.entries(links)) await symlink(target, join(copy.tree, 'app', name));
      await put('app/ok.txt');
      await symlink('ok.txt', join(copy.tree, 'app/fine'));
      const report = await filterDiffTree(copy, BASE_SCOPE);
      expect(left()).toEqual(['app', 'app/fine', 'app/ok.txt']);
      expect(report.dropped.map((d) => d.reason)).toEqual(Object.keys(links).map(() => 'links_into_hidden'));
    }));
});
