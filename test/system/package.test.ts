import { spawnSync, type SpawnSyncOptions } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { STORE_DIR } from '../support/platform.ts';

/** The README's quickstart as a user's own module would hold it (Node 20 has no `await using`). */
const QUICKSTART = `import { Platform } from 'sandgym';

const platform = await Platform.local();
try {
  const sandbox = await platform.createSandbox({ environment: 'debian:bookworm', resources: { memoryMib: 256 } });
  try {
    const result = await sandbox.exec(['python3', '-c', 'print(6*7)'], { timeoutMs: 10_000 });
    console.log(JSON.stringify({ exitCode: result.exitCode, stdout: result.stdout }));
  } finally {
    await sandbox.close();
  }
} finally {
  await platform.close();
}
`;

/** The client entry, run as nobody: it loads without root and fails a dead address with a typed error. */
const CLIENT = `import { connect, SandgymError, SANDGYM_ERROR_CODES } from 'sandgym/client';

try {
  await connect('grpc://127.0.0.1:9', { token: 'unused', connectTimeoutMs: 300 });
  console.log('connected?');
} catch (error) {
  console.log(JSON.stringify({ uid: process.getuid(), typed: error instanceof SandgymError, code: error.code, known: SANDGYM_ERROR_CODES.includes(error.code) }));
}
`;

function run(command: string, args: string[], options: SpawnSyncOptions) {
  const result = spawnSync(command, args, { encoding: 'utf8', timeout: 600_000, ...options });
  const output = `${String(result.stdout)}\n${String(result.stderr)}`;
  expect(result.status, `${command} ${args.join(' ')}:\n${output}`).toBe(0);
  return String(result.stdout);
}

describe('the npm package', () => {
  it('packs what users need, installs into a new project, and runs the quickstart from there', async () => {
    const work = await mkdtemp(join(tmpdir(), 'sandgym-package-'));
    try {
      await chmod(work, 0o755); // nobody runs the client from here
      const packed = JSON.parse(
        run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], {}),
      ) as { filename: string; files: { path: string }[] }[];
      const files = packed[0]!.files.map((f) => f.path);
      expect(files).toEqual(
        expect.arrayContaining([
          'dist/src/index.js',
          'dist/src/index.d.ts',
          'dist/src/client.js',
          'dist/src/env/verifiers/swebench_runner.py',
          'agent/Makefile',
          'agent/agent.c',
          // the Python client, pip-installable from the package's python/ folder
          'python/pyproject.toml',
          'python/sandgym/py.typed',
          'python/sandgym/aio.py',
        ]),
      );
      // no tests, no TypeScript sources, no source maps, no checkout data
      expect(files.filter((f) => /^(test|src)\/|\.map$|^\.sandgym|^build\//.test(f))).toEqual([]);

      const project = join(work, 'project');
      await mkdir(project);
      await writeFile(
        join(project, 'package.json'),
        JSON.stringify({ name: 'user-job', private: true, type: 'module' }),
      );
      run(
        'npm',
        ['install', '--no-audit', '--no-fund', '--prefer-offline', join(work, packed[0]!.filename)],
        {
          cwd: project,
        },
      );

      // setup compiles the agent into the data folder (not node_modules); the store is the suite's
      const data = join(work, 'data');
      const env: NodeJS.ProcessEnv = { ...process.env, SANDGYM_DATA_DIR: data, SANDGYM_STORE: STORE_DIR };
      delete env['SANDGYM_AGENT'];
      run(join(project, 'node_modules', '.bin', 'sandgym'), ['setup'], { cwd: project, env });
      expect(
        (await readdir(join(data, 'bin'))).filter((name) => name.startsWith('sandgym-agent-')),
      ).toHaveLength(1);
      expect((await stat(data)).mode & 0o777).toBe(0o700); // root's alone, like every data folder

      await writeFile(join(project, 'quickstart.mjs'), QUICKSTART);
      const quickstart = JSON.parse(run('node', ['quickstart.mjs'], { cwd: project, env })) as {
        exitCode: number;
        stdout: string;
      };
      expect(quickstart.exitCode).toBe(0);
      expect(quickstart.stdout).toBe('42\n');

      await writeFile(join(project, 'client.mjs'), CLIENT);
      await chmod(join(project, 'client.mjs'), 0o644);
      const client = JSON.parse(
        run('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'node', 'client.mjs'], {
          cwd: project,
          env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin', HOME: '/nonexistent' },
        }),
      ) as { uid: number; typed: boolean; code: string; known: boolean };
      expect(client).toMatchObject({ uid: 65534, typed: true, known: true });
    } finally {
      await rm(work, { recursive: true, force: true });
    }
  });
});
