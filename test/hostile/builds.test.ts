import { execFileSync } from 'node:child_process';
import { mkdir, rm, symlink, writeFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { loadSweBenchFile, loadTasks } from '../../src/env/index.ts';
import type { DockerfileBuildOptions, LocalPlatform } from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import { TEST_DATA_ROOT, createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

/** A task author's build context is untrusted input too: nothing of the host may leave through it. */
/** Builds an environment on `platform` and reads one of its files from a sandbox of it. */
async function builtFile(
  platform: LocalPlatform,
  build: DockerfileBuildOptions,
  path: string,
): Promise<string> {
  const { environment } = await platform.buildFromDockerfile(build);
  await using sandbox = await platform.createSandbox({
    environment: `${environment.name}:${environment.version}`,
  });
  return (await sandbox.readFile(path)).toString();
}

describe('Dockerfile builds under attack', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-builds', { privateStore: true });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function context(name: string, dockerfile: string): Promise<string> {
    const dir = join(env.dataDir, name);
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'Dockerfile'), dockerfile);
    return dir;
  }

  it('says the same of a link out whether its host target exists or not', () =>
    attack('build', 'an existence oracle for host paths through COPY errors', async () => {
      const said: string[] = [];
      for (const target of ['/etc/hostname', '/etc/no-such-file-here']) {
        const dir = await context(`oracle-${said.length}`, 'FROM busybox:latest\nCOPY probe /p\n');
        await symlink(target, join(dir, 'probe'));
        const error = await env.platform
          .buildFromDockerfile({ file: join(dir, 'Dockerfile'), name: 'oracle:1' })
          .then(
            () => undefined,
            (failure: unknown) => failure,
          );
        said.push(String(error).replaceAll(dir, 'CONTEXT'));
      }
      expect(said[0]).toMatch(/"probe" is outside the build context/);
      expect(said[1]).toBe(said[0]);
    }));

  it('matches a hostile .dockerignore and COPY glob in time that grows with the name, never stalling', () =>
    attack('build', 'a backtracking glob in .dockerignore and COPY', async () => {
      const glob = `${'**a'.repeat(12)}**c`;
      const dir = await context('redos', `FROM busybox:latest\nCOPY ${glob} /globbed/\nCOPY . /x/\n`);
      await writeFile(join(dir, '.dockerignore'), `${glob.slice(0, -1)}d\n`);
      await writeFile(join(dir, `${'a'.repeat(200)}c`), 'matched\n');
      await writeFile(join(dir, 'a'.repeat(200)), 'kept\n');
      // as regular expressions these globs took hours on such names; now they are walked once
      const { environment } = await env.platform.buildFromDockerfile({
        file: join(dir, 'Dockerfile'),
        name: 'redos:1',
      });
      await using sandbox = await env.platform.createSandbox({
        environment: `${environment.name}:${environment.version}`,
      });
      const listed = await sandbox.exec(['sh', '-c', 'ls /globbed | wc -l; ls /x | wc -l']);
      // the glob took the one name it matches; the .dockerignore (ending in d) left out nothing
      expect(listed.stdout).toBe('1\n3\n');
    }));

  for (const [name, plant, dockerfile] of [
    ['a link to /etc/shadow', (dir: string) => symlink('/etc/shadow', join(dir, 'shadow')), 'COPY shadow /x'],
    [
      'a folder link out of the context',
      (dir: string) => symlink('/etc', join(dir, 'etc')),
      'COPY etc/shadow /x',
    ],
    ["a link to the context's parent", (dir: string) => symlink('..', join(dir, 'up')), 'ADD up/ /x/'],
  ] as const) {
    it(`refuses COPY/ADD through ${name}, naming the file and line`, () =>
      attack('build', `COPY through ${name}`, async () => {
        const dir = await context(
          `ctx-${Math.random().toString(36).slice(2, 8)}`,
          `FROM busybox:latest\n${dockerfile}\n`,
        );
        await plant(dir);
        await expectCode(
          env.platform.buildFromDockerfile({ file: join(dir, 'Dockerfile'), name: 'leak:1' }),
          'invalid_argument',
          /Dockerfile line 2: .* is outside the build context/,
        );
        expect(env.platform.store.hasEnvironment('leak:1')).toBe(false);
      }));
  }

  it('copies what a link inside the context points at inside it', async () => {
    const dir = await context('inside', 'FROM busybox:latest\nCOPY alias /data.txt\n');
    await writeFile(join(dir, 'real.txt'), 'inside\n');
    await symlink('real.txt', join(dir, 'alias'));
    expect(
      await builtFile(env.platform, { file: join(dir, 'Dockerfile'), name: 'inside:1' }, '/data.txt'),
    ).toBe('inside\n');
  });
});

/** Every message in an error and its causes: a refusal must not quote what it refused. */
function errorText(error: unknown): string {
  const parts: string[] = [];
  for (let cause = error; cause instanceof Error; cause = cause.cause) parts.push(cause.message);
  return parts.join(' <- ');
}

/** The error `promise` fails with (a SandgymError `invalid_argument`), or a test failure. */
async function refusal(promise: Promise<unknown>): Promise<string> {
  const error: unknown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(isSandgymError(error, 'invalid_argument'), `expected a refusal, got ${String(error)}`).toBe(true);
  return errorText(error);
}

/**
 * A task author names paths: compose build contexts and Dockerfiles, the task's own files. Each
 * must resolve beneath the task folder; none may make a host folder a build context, a host file
 * the Dockerfile or ignore file, or let an error quote a host file.
 */
describe('paths a task names, under attack', () => {
  let env: TestPlatform;
  /** A host folder outside every task: its file holds a canary that must never show. */
  let host: string;
  const CANARY = `HOSTCANARY${Math.random().toString(36).slice(2, 10)}`;
  let count = 0;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-task-paths', { privateStore: true });
    host = join(env.dataDir, 'host-secrets');
    await mkdir(host, { recursive: true });
    await writeFile(join(host, 'secret.txt'), `${CANARY} not a Dockerfile\nsecret.txt\n`);
    await writeFile(join(host, 'Dockerfile'), `FROM busybox:latest\nCOPY . /stolen/\n# ${CANARY}\n`);
    // what a task's tests folder holds, so only the link gives the folder away
    await writeFile(join(host, 'test.sh'), `echo ${CANARY}\n`);
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  /** A Harbor task folder with a compose service `db`; `compose` is its build section. */
  async function harborTask(build: string): Promise<string> {
    const dir = join(env.dataDir, `task-${++count}`);
    await mkdir(join(dir, 'environment/db'), { recursive: true });
    await mkdir(join(dir, 'tests'), { recursive: true });
    await writeFile(join(dir, 'task.toml'), '[agent]\ntimeout_sec = 60\n');
    await writeFile(join(dir, 'instruction.md'), 'Do it.\n');
    await writeFile(join(dir, 'tests/test.sh'), 'echo 1 > /logs/verifier/reward.txt\n');
    await writeFile(join(dir, 'environment/Dockerfile'), 'FROM busybox:latest\n');
    await writeFile(join(dir, 'environment/db/Dockerfile'), 'FROM busybox:latest\n');
    await writeFile(
      join(dir, 'environment/docker-compose.yaml'),
      `services:\n  main:\n    build: .\n  db:\n${build}`,
    );
    return dir;
  }

  for (const [name, build, plant] of [
    ['a context that is a symlink to a host folder', '    build: ./hostdir\n', 'hostdir'],
    ['a context through a symlinked parent', '    build:\n      context: hostdir/..\n', 'hostdir'],
    ['an absolute context', '    build: HOST\n', undefined],
    ['a context climbing with ..', '    build:\n      context: UP\n', undefined],
    [
      'a dockerfile that is a symlink to a host file',
      '    build:\n      context: db\n      dockerfile: evil\n',
      'db/evil',
    ],
    ['a dockerfile climbing out', '    build:\n      context: db\n      dockerfile: UPFILE\n', undefined],
  ] as const) {
    it(`refuses a compose service with ${name}, quoting nothing of the host`, () =>
      attack('build', `compose: ${name}`, async () => {
        const dir = await harborTask(
          build
            .replace('HOST', host)
            .replace('UPFILE', `${relative(join(dir0(), 'environment/db'), host)}/Dockerfile`)
            .replace('UP', relative(join(dir0(), 'environment'), host)),
        );
        if (plant === 'hostdir') await symlink(host, join(dir, 'environment/hostdir'));
        if (plant === 'db/evil') await symlink(join(host, 'Dockerfile'), join(dir, 'environment/db/evil'));
        const text = await refusal(loadTasks([dir]));
        expect(text).toMatch(/docker-compose\.yaml service "db"/);
        expect(text).not.toContain(CANARY);
      }));
  }

  /** The next task folder's path (the one {@link harborTask} makes next), for relative climbs. */
  function dir0(): string {
    return join(env.dataDir, `task-${count + 1}`);
  }

  for (const [name, file, target] of [
    ['its Dockerfile', 'environment/Dockerfile', 'secret.txt'],
    ['its task.toml', 'task.toml', 'secret.txt'],
    ['its instruction', 'instruction.md', 'secret.txt'],
    ['its compose file', 'environment/docker-compose.yaml', 'secret.txt'],
    ['its environment folder', 'environment', '.'],
    ['its tests folder', 'tests', '.'],
  ] as const) {
    it(`refuses a task whose ${name} is a symlink to the host, quoting nothing of it`, () =>
      attack('build', `task file: ${name} a symlink out`, async () => {
        const dir = await harborTask('    image: busybox:latest\n');
        execFileSync('rm', ['-rf', join(dir, file)]);
        await symlink(join(host, target), join(dir, file));
        const text = await refusal(loadTasks([dir]));
        expect(text).not.toContain(CANARY);
        expect(text).not.toContain('host-secrets');
      }));
  }

  it('refuses a folder of tasks whose entry links to a task elsewhere on the host', () =>
    attack('build', 'folder of tasks: an entry linking out', async () => {
      const elsewhere = await harborTask('    image: busybox:latest\n');
      const suite = join(env.dataDir, `suite-${++count}`);
      await mkdir(suite, { recursive: true });
      await symlink(elsewhere, join(suite, 'linked-task'));
      const text = await refusal(loadTasks([suite]));
      expect(text).toMatch(/linked-task.*is outside/);
    }));

  it('refuses a Dockerfile or context outside the root it is built under, quoting nothing', () =>
    attack('build', 'builder: Dockerfile and context outside the root', async () => {
      const dir = await harborTask('    image: busybox:latest\n');
      await symlink(join(host, 'secret.txt'), join(dir, 'environment/Linked'));
      await symlink(host, join(dir, 'environment/ctx'));
      for (const [file, context] of [
        [join(dir, 'environment/Linked'), join(dir, 'environment')],
        [join(dir, 'environment/Dockerfile'), join(dir, 'environment/ctx')],
        [join(host, 'Dockerfile'), join(dir, 'environment')],
      ]) {
        const text = await refusal(
          env.platform.buildFromDockerfile({ file: file!, context: context!, root: dir, name: 'leak:2' }),
        );
        expect(text).toMatch(/is outside/);
        expect(text).not.toContain(CANARY);
      }
      expect(env.platform.store.hasEnvironment('leak:2')).toBe(false);
    }));

  it('refuses a .dockerignore that is a symlink out of the context', () =>
    attack('build', '.dockerignore a symlink to a host file', async () => {
      const dir = await harborTask('    image: busybox:latest\n');
      await writeFile(join(dir, 'environment/Dockerfile'), 'FROM busybox:latest\nCOPY secret.txt /x\n');
      await writeFile(join(dir, 'environment/secret.txt'), 'mine\n');
      await symlink(join(host, 'secret.txt'), join(dir, 'environment/.dockerignore'));
      const text = await refusal(
        env.platform.buildFromDockerfile({ file: join(dir, 'environment/Dockerfile'), name: 'leak:3' }),
      );
      expect(text).toMatch(/\.dockerignore.*outside/);
      expect(text).not.toContain(CANARY);
    }));

  for (const file of [
    'environment/Dockerfile',
    'environment/.dockerignore',
    'task.toml',
    'environment/docker-compose.yaml',
  ]) {
    it(`refuses a FIFO as ${file} at once`, () =>
      attack('build', `FIFO as ${file}`, async () => {
        const dir = await harborTask('    image: busybox:latest\n');
        execFileSync('rm', ['-f', join(dir, file)]);
        execFileSync('mkfifo', [join(dir, file)]);
        const text = file.endsWith('.dockerignore')
          ? await refusal(
              env.platform.buildFromDockerfile({ file: join(dir, 'environment/Dockerfile'), name: 'fifo:1' }),
            )
          : await refusal(
              loadTasks([dir]).then((tasks) => {
                const source = tasks[0]!.environment;
                if (source.kind !== 'dockerfile') return;
                return env.platform.buildFromDockerfile({
                  ...source,
                  file: source.dockerfile,
                  name: 'fifo:1',
                });
              }),
            );
        expect(text).toMatch(/not a regular file/);
      }));
  }

  it('loads and builds a task whose compose paths stay inside its folder, links included', async () => {
    const dir = await harborTask('    build:\n      context: alias\n      dockerfile: ../db/Dockerfile\n');
    await symlink('db', join(dir, 'environment/alias'));
    await writeFile(join(dir, 'environment/.dockerignore'), 'ignored.txt\n');
    await writeFile(join(dir, 'environment/data.txt'), 'inside\n');
    await writeFile(join(dir, 'environment/Dockerfile'), 'FROM busybox:latest\nCOPY data.txt /data.txt\n');
    const [task] = await loadTasks([dir]);
    expect(task!.services?.[0]?.source).toMatchObject({
      kind: 'dockerfile',
      context: join(dir, 'environment/db'),
      dockerfile: join(dir, 'environment/db/Dockerfile'),
    });
    const source = task!.environment;
    if (source.kind !== 'dockerfile') throw new Error('expected a Dockerfile task');
    expect(
      await builtFile(
        env.platform,
        { ...source, file: source.dockerfile, name: 'honest-task:1' },
        '/data.txt',
      ),
    ).toBe('inside\n');
  });
});

/**
 * A SWE-bench row's `repo` is data someone else wrote, and the repository it names is copied
 * into an image: it may name `owner/name` (found in a mirror) or a repository inside the rows'
 * own folder, never a host folder.
 */
describe('SWE-bench rows naming host repositories', () => {
  let root: string;
  const ROW = {
    instance_id: 'x__y-1',
    base_commit: 'abcdef1',
    patch: '',
    test_patch: 'diff',
    problem_statement: 'Fix it.',
    FAIL_TO_PASS: ['t'],
    PASS_TO_PASS: [],
  };

  beforeAll(async () => {
    root = join(TEST_DATA_ROOT, `hostile-swe-rows-${Math.random().toString(36).slice(2, 8)}`);
    // a host repository the rows' author must not reach: another project's code, say
    await mkdir(join(root, 'host/private'), { recursive: true });
    execFileSync('git', ['init', '-q', join(root, 'host/private')]);
    await mkdir(join(root, 'rows/repos/acme'), { recursive: true });
  });

  afterAll(async () => {
    await rm(root, { recursive: true, force: true });
  });

  async function rowsNaming(repo: string): Promise<string> {
    const file = join(root, 'rows', `r-${Math.random().toString(36).slice(2, 8)}.swebench.jsonl`);
    await writeFile(file, `${JSON.stringify({ ...ROW, repo })}\n`);
    return file;
  }

  for (const [name, repo, plant] of [
    ['an absolute host path', 'HOST', undefined],
    ['a path climbing out', '../host/private', undefined],
    ['"../.." shaped as owner/name', '../..', undefined],
    ['a symlink beside the rows to a host repository', 'linked', 'linked'],
    ['owner/name whose mirror entry is a symlink out', 'acme/tool', 'repos/acme/tool'],
    ['a repository borrowing a host store (alternates)', 'borrower', 'alternates'],
  ] as const) {
    it(`refuses a row whose repo is ${name}`, () =>
      attack('build', `SWE-bench repo: ${name}`, async () => {
        const host = join(root, 'host/private');
        if (plant === 'alternates') {
          const borrower = join(root, 'rows/borrower');
          execFileSync('git', ['init', '-q', borrower]);
          await writeFile(join(borrower, '.git/objects/info/alternates'), `${host}/.git/objects\n`);
        } else if (plant) await symlink(host, join(root, 'rows', plant)).catch(() => undefined);
        const text = await refusal(loadSweBenchFile(await rowsNaming(repo.replace('HOST', host)), {}));
        expect(text).toMatch(/line 1/);
      }));
  }

  it('loads a row whose repo is a bundle beside it or owner/name in its repos folder', async () => {
    await writeFile(join(root, 'rows/calc.bundle'), 'not checked until the build');
    const [beside] = await loadSweBenchFile(await rowsNaming('calc.bundle'), {});
    expect(beside!.environment).toMatchObject({ repo: join(root, 'rows/calc.bundle') });
    execFileSync('git', ['init', '-q', join(root, 'rows/repos/acme/honest')]);
    const [mirrored] = await loadSweBenchFile(await rowsNaming('acme/honest'), {});
    expect(mirrored!.environment).toMatchObject({ repo: join(root, 'rows/repos/acme/honest') });
  });
});
