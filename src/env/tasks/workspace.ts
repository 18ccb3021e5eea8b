import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';
import { parseEnvironmentRef, type Environment, type LocalPlatform } from '../../platform/index.ts';
import type { TaskEnvironmentSource } from './task.ts';

type Workspace = Extract<TaskEnvironmentSource, { kind: 'workspace' }>;

function git(dir: string, ...args: string[]): Promise<string> {
  return runProgram('git', ['-C', dir, '-c', 'advice.detachedHead=false', ...args], {
    timeoutMs: 10 * 60_000,
  });
}

/**
 * Scrubs a checkout to its base commit, so no later commit can leak the answer: one branch at
 * the base, no remotes, no tags, the reflog expired and unreachable objects pruned. Then audits:
 * any commit that is not an ancestor of the base fails the setup.
 */
export async function scrubToBase(dir: string, baseCommit: string): Promise<void> {
  await git(dir, 'checkout', '-q', '--detach', baseCommit);
  await git(dir, 'checkout', '-q', '-B', 'main', baseCommit);
  for (const branch of (
    await git(dir, 'for-each-ref', '--format=%(refname)', 'refs/heads', 'refs/remotes', 'refs/tags')
  )
    .split('\n')
    .filter(Boolean)) {
    if (branch !== 'refs/heads/main') await git(dir, 'update-ref', '-d', branch);
  }
  for (const remote of (await git(dir, 'remote')).split('\n').filter(Boolean))
    await git(dir, 'remote', 'remove', remote);
  await git(dir, 'reflog', 'expire', '--expire=now', '--all');
  await git(dir, 'gc', '-q', '--prune=now');
  const later = (await git(dir, 'rev-list', '--all', `^${baseCommit}`)).split('\n').filter(Boolean);
  if (later.length > 0) {
    throw new SandgymError(
      'failed_precondition',
      `History audit of ${dir}: ${later.length} commits after base ${baseCommit} remain`,
    );
  }
}

/** The name a task's workspace environment is stored under: it pins the repository's commit. */
export function workspaceEnvironmentName(id: string, source: Workspace): string {
  return `swe-${id.toLowerCase().replace(/[^a-z0-9._-]/g, '-')}:${source.baseCommit.slice(0, 12)}`;
}

/**
 * The environment of a task with a git workspace: its base environment plus one layer holding
 * the repository at the base commit, scrubbed. Built once and kept under a name that pins the
 * repository and commit.
 */
export async function workspaceEnvironment(
  platform: LocalPlatform,
  id: string,
  source: Workspace,
): Promise<Environment> {
  const ref = workspaceEnvironmentName(id, source);
  const name = parseEnvironmentRef(ref).name;
  if (platform.store.hasEnvironment(ref)) return platform.store.getEnvironment(ref);
  const base = await platform.store.getEnvironment(source.base);
  const scratch = await platform.store.scratch('workspace');
  try {
    const checkout = join(scratch, source.path);
    await runProgram('git', ['clone', '-q', '--no-hardlinks', source.repo, checkout], {
      timeoutMs: 30 * 60_000,
    }).catch((error: unknown) => {
      throw new SandgymError('invalid_argument', `Cannot clone the task repository ${source.repo}`, {
        cause: error,
      });
    });
    await git(checkout, 'cat-file', '-e', `${source.baseCommit}^{commit}`).catch((error: unknown) => {
      throw new SandgymError(
        'invalid_argument',
        `Base commit ${source.baseCommit} is not in ${source.repo}`,
        { cause: error },
      );
    });
    await scrubToBase(checkout, source.baseCommit);
    const layer = await platform.store.addLayerFromDirectory(
      scratch,
      `workspace ${source.repo} at ${source.baseCommit}`,
    );
    return await platform.store.putEnvironment({
      name,
      version: source.baseCommit.slice(0, 12),
      layers: [...base.layers, layer.digest],
      config: { ...base.config, workdir: source.path },
      description: `${source.base} + ${source.repo} at ${source.baseCommit}, history scrubbed`,
    });
  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
}
