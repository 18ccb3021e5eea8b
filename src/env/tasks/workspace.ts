import { existsSync } from 'node:fs';
import { rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from '../../backends/index.ts';
import { SandgymError } from '../../common/index.ts';
import { parseEnvironmentRef, type Environment, type HostPlatform } from '../../platform/index.ts';
import { taskStorageStem, type Task, type TaskEnvironmentSource } from './task.ts';

type Workspace = Extract<TaskEnvironmentSource, { kind: 'workspace' }>;

function git(dir: string, ...args: string[]): Promise<string> {
  return runProgram('git', ['-C', dir, '-c', 'advice.detachedHead=false', ...args], {
    timeoutMs: 10 * 60_000,
  });
}

/**
 * Scrubs a checkout to its base commit, so no later commit can leak the answer. Deleting refs
 * and pruning is not enough: objects can outlive every ref (a pack marked `.promisor` survives
 * `git gc`, an alternates file lends another store's objects, replace refs and notes name
 * more). So the repository is rebuilt: a new object store receives exactly what the base commit
 * reaches (fetched by id into an empty repository), one branch points at it, and the old `.git`
 * (hooks, config, remotes, reflogs, alternates, packs) goes whole. Then every object the store
 * holds, reachable or not, is audited: a commit that is not the base or an ancestor of it fails
 * the setup.
 */
async function scrubToBase(dir: string, baseCommit: string): Promise<void> {
  const base = (await git(dir, 'rev-parse', '--verify', `${baseCommit}^{commit}`)).trim();
  await git(dir, 'checkout', '-q', '--detach', base);
  const fresh = `${dir}.git-fresh`;
  await rm(fresh, { recursive: true, force: true });
  try {
    await runProgram('git', ['init', '-q', '--template=', fresh], { timeoutMs: 60_000 });
    // fetch by id needs the source to allow it; its upload-pack is ours to configure
    await git(
      fresh,
      'fetch',
      '-q',
      '--no-tags',
      '--upload-pack',
      'git -c uploadpack.allowAnySHA1InWant=true upload-pack',
      dir,
      base,
    );
    await git(fresh, 'update-ref', 'refs/heads/main', base);
    await git(fresh, 'symbolic-ref', 'HEAD', 'refs/heads/main');
    await rm(join(fresh, '.git', 'FETCH_HEAD'), { force: true });
    await rm(join(dir, '.git'), { recursive: true, force: true });
    await rename(join(fresh, '.git'), join(dir, '.git'));
  } finally {
    await rm(fresh, { recursive: true, force: true });
  }
  await git(dir, 'reset', '-q'); // the index anew, for a working tree that is the base already
  await auditObjects(dir, base);
}

/** Fails unless every commit object in the repository's store is the base or an ancestor of it. */
async function auditObjects(dir: string, base: string): Promise<void> {
  const ancestors = new Set((await git(dir, 'rev-list', base)).split('\n').filter(Boolean));
  const commits = (
    await git(dir, 'cat-file', '--batch-all-objects', '--batch-check=%(objecttype) %(objectname)')
  )
    .split('\n')
    .filter((line) => line.startsWith('commit '))
    .map((line) => line.slice('commit '.length));
  const later = commits.filter((commit) => !ancestors.has(commit));
  const leaks = ['objects/info/alternates', 'shallow', 'packed-refs'].filter((path) =>
    existsSync(join(dir, '.git', path)),
  );
  const refs = (await git(dir, 'for-each-ref', '--format=%(refname)')).split('\n').filter(Boolean);
  if (later.length > 0 || leaks.length > 0 || refs.join() !== 'refs/heads/main') {
    throw new SandgymError(
      'failed_precondition',
      `History audit of ${dir}: ${later.length} commits besides base ${base} and its ancestors remain` +
        (leaks.length ? `; it still has ${leaks.join(', ')}` : '') +
        (refs.join() !== 'refs/heads/main' ? `; refs: ${refs.join(', ')}` : ''),
    );
  }
}

/** The name a task's workspace environment is stored under: it pins the repository's commit. */
export function workspaceEnvironmentName(task: Pick<Task, 'id' | 'source'>, source: Workspace): string {
  return `${taskStorageStem('swe', task)}:${source.baseCommit.slice(0, 12)}`;
}

/**
 * The environment of a task with a git workspace: its base environment plus one layer holding
 * the repository at the base commit, scrubbed, and then what its recipe installs (packages from
 * the node's mirror, an install that fetches nothing), built like a Dockerfile so each step is
 * cached. Built once and kept under a name that pins the repository and commit.
 */
export async function workspaceEnvironment(
  platform: HostPlatform,
  task: Pick<Task, 'id' | 'source'>,
  source: Workspace,
): Promise<Environment> {
  const ref = workspaceEnvironmentName(task, source);
  if (platform.store.hasEnvironment(ref)) return platform.store.getEnvironment(ref);
  if (!source.setup) return checkoutEnvironment(platform, source, ref);
  const checkout = await checkoutEnvironment(platform, source, `${ref}-checkout`);
  return installOver(platform, `${checkout.name}:${checkout.version}`, source.setup, ref);
}

/** A generated Dockerfile over the checkout: the recipe's packages, then its install in the repository. */
async function installOver(
  platform: HostPlatform,
  checkout: string,
  setup: NonNullable<Workspace['setup']>,
  ref: string,
): Promise<Environment> {
  const context = await platform.store.scratch('recipe');
  try {
    const lines = [`FROM ${checkout}`];
    if (setup.apt.length)
      lines.push(
        `RUN apt-get update && apt-get install -y --no-install-recommends ${setup.apt.join(' ')} && rm -rf /var/lib/apt/lists/*`,
      );
    if (setup.install) lines.push(`RUN ${setup.install}`);
    await writeFile(join(context, 'Dockerfile'), `${lines.join('\n')}\n`);
    return (await platform.buildFromDockerfile({ file: join(context, 'Dockerfile'), context, name: ref }))
      .environment;
  } finally {
    await platform.store.removeScratch(context);
  }
}

/** The base environment plus the scrubbed checkout, stored as `ref`. */
async function checkoutEnvironment(
  platform: HostPlatform,
  source: Workspace,
  ref: string,
): Promise<Environment> {
  if (platform.store.hasEnvironment(ref)) return platform.store.getEnvironment(ref);
  const { name, version } = parseEnvironmentRef(ref);
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
      version,
      layers: [...base.layers, layer.digest],
      config: { ...base.config, workdir: source.path },
      description: `${source.base} + ${source.repo} at ${source.baseCommit}, history scrubbed`,
    });
  } finally {
    await platform.store.removeScratch(scratch);
  }
}
