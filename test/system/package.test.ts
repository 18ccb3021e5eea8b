import { chmod, mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { installedEnv, packAndInstall, runOk } from '../support/package.ts';

/** The client entry, run as nobody: it loads without root and fails a dead address with a typed error. */
const CLIENT = `import { connect, SandgymError, SANDGYM_ERROR_CODES } from 'sandgym/client';

try {
  await connect('grpc://127.0.0.1:9', { token: 'unused', connectTimeoutMs: 300 });
  console.log('connected?');
} catch (error) {
  console.log(JSON.stringify({ uid: process.getuid(), typed: error instanceof SandgymError, code: error.code, known: SANDGYM_ERROR_CODES.includes(error.code) }));
}
`;

// The README's samples run from such an install in test/system/doc-samples.test.ts.
describe('the npm package', () => {
  it('packs what users need, installs into a new project, sets up and loads the client as nobody', async () => {
    const work = await mkdtemp(join(tmpdir(), 'sandgym-package-'));
    try {
      await chmod(work, 0o755); // nobody runs the client from here
      const { project, files } = await packAndInstall(work);
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

      // setup compiles the agent into the data folder (not node_modules); the store is the suite's
      const data = join(work, 'data');
      const env = installedEnv(data);
      runOk(join(project, 'node_modules', '.bin', 'sandgym'), ['setup'], { cwd: project, env });
      expect(
        (await readdir(join(data, 'bin'))).filter((name) => name.startsWith('sandgym-agent-')),
      ).toHaveLength(1);
      expect((await stat(data)).mode & 0o777).toBe(0o700); // root's alone, like every data folder

      await writeFile(join(project, 'client.mjs'), CLIENT);
      await chmod(join(project, 'client.mjs'), 0o644);
      const client = JSON.parse(
        runOk('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'node', 'client.mjs'], {
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
