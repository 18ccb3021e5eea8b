import { execFileSync } from 'node:child_process';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GIT_CHEATS } from '../../examples/agents/cheats.ts';
import { TaskEnv, loadSweBenchFile, type Task } from '../../src/env/index.ts';
import { evaluate, oracleAgent, scriptedAgent } from '../../src/rollout/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const ROWS = resolve('examples/tasks/calc.swebench.jsonl');

function git(dir: string, ...args: string[]): string {
  return execFileSync('git', ['-C', dir, '-c', 'user.name=t', '-c', 'user.email=t@t', ...args], {
    encoding: 'utf8',
  }).trim();
}

/**
 * SWE-bench workspaces: the answer must not be readable from the repository in any form an
 * object store can keep it, and the repository's git must not run anything while grading.
 */
describe('SWE-bench history and git', () => {
  let env: TestPlatform;
  let calc: Task;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-history', { privateStore: true, seed: ['debian:bookworm'] });
    [calc] = (await loadSweBenchFile(ROWS)) as [Task];
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  /**
   * A repository whose answer commit is out of every ref but still in its object store: in a
   * pack marked `.promisor` (which `git gc` keeps), under a note, and behind a replace ref.
   */
  async function repositoryHidingTheAnswer(): Promise<{ repo: string; base: string; answer: string }> {
    const repo = join(env.dataDir, `hidden-${Math.random().toString(36).slice(2, 8)}`);
    await mkdir(repo, { recursive: true });
    git(repo, 'init', '-q', '-b', 'main');
    await writeFile(join(repo, 'ops.py'), 'def mean(v):\n    return sum(v) / (len(v) + 1)\n');
    git(repo, 'add', '.');
    git(repo, 'commit', '-q', '-m', 'base');
    const base = git(repo, 'rev-parse', 'HEAD');
    await writeFile(join(repo, 'ops.py'), 'def mean(v):\n    return sum(v) / len(v)\n');
    git(repo, 'commit', '-q', '-am', 'the answer');
    const answer = git(repo, 'rev-parse', 'HEAD');
    const pack = execFileSync(
      'git',
      ['-C', repo, 'pack-objects', '--revs', join(repo, '.git/objects/pack/pack')],
      {
        input: `${answer}\n^${base}\n`,
        encoding: 'utf8',
      },
    ).trim();
    await writeFile(join(repo, `.git/objects/pack/pack-${pack}.promisor`), '');
    git(repo, 'config', 'remote.origin.url', '/nonexistent');
    git(repo, 'config', 'remote.origin.promisor', 'true');
    git(repo, 'config', 'extensions.partialClone', 'origin');
    git(repo, 'notes', 'add', '-m', `see ${answer}`, base);
    git(repo, 'reset', '-q', '--hard', base);
    git(repo, 'reflog', 'expire', '--expire=now', '--all');
    git(repo, 'gc', '-q', '--prune=now');
    expect(git(repo, 'cat-file', '-t', answer)).toBe('commit'); // still there, out of every ref
    return { repo, base, answer };
  }

  it('leaves no commit after the base readable in the workspace, reachable or not', () =>
    attack('history', 'a later commit kept in a promisor pack', async () => {
      const { repo, base, answer } = await repositoryHidingTheAnswer();
      const row = JSON.parse((await readFile(ROWS, 'utf8')).trim()) as Record<string, unknown>;
      const rows = join(env.dataDir, `hidden-${base.slice(0, 8)}.swebench.jsonl`);
      await writeFile(
        rows,
        // beside the rows: a row names repositories inside its own folder only
        `${JSON.stringify({ ...row, instance_id: `hidden-${base.slice(0, 8)}`, repo: basename(repo), base_commit: base })}\n`,
      );
      const [task] = await loadSweBenchFile(rows);
      await using gym = TaskEnv.create(env.platform, task!);
      await gym.reset();
      const inside = (...args: string[]) => gym.sandbox!.exec(['git', '-C', '/testbed', ...args]);
      expect((await inside('cat-file', '-e', answer)).exitCode).not.toBe(0);
      expect((await inside('show', answer)).exitCode).not.toBe(0);
      const objects = await inside(
        'cat-file',
        '--batch-all-objects',
        '--batch-check=%(objecttype) %(objectname)',
      );
      const commits = objects.stdout.split('\n').filter((line) => line.startsWith('commit '));
      expect(commits).toEqual([`commit ${base}`]);
      expect((await inside('notes', 'list')).stdout).toBe('');
      expect((await gym.sandbox!.exec(['ls', '/testbed/.git/hooks'])).exitCode).not.toBe(0);
      await rm(rows);
    }));

  it('grades the calc task: the oracle passes', async () => {
    const [report] = await evaluate(env.platform, [calc], oracleAgent, { concurrency: 1 });
    expect(report).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
  });

  for (const [name, actions] of Object.entries(GIT_CHEATS)) {
    it(`scores ${name} 0: git runs nothing of the agent's while grading`, () =>
      attack('history', name, async () => {
        const [report] = await evaluate(env.platform, [calc], () => scriptedAgent(actions), {
          concurrency: 1,
        });
        expect(report?.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
        expect(report?.reward, JSON.stringify(report?.details)).toBe(0);
      }));
  }
});
