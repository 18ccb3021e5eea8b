import { execFile, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { cp, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadTasks } from '../../src/env/index.ts';
import { NODE_TOKEN, startLoneNode, type LoneNode, type NodeProcess } from '../support/cluster.ts';
import { createTestPlatform } from '../support/platform.ts';
import { startFakeModel } from '../support/fake-model.ts';
import { docSamples } from '../support/doc-blocks.ts';
import { PYTHON } from '../../benchmarks/python-client.ts';

const PYTHON_DIR = resolve('python');
const execFileAsync = promisify(execFile);
const TASK_ROOT = resolve('examples/tasks');

/** The Python client (python/) against a real node agent: its own unittest suite and its example. */
describe('the Python client', () => {
  const tag = randomBytes(2).toString('hex');
  let lone: LoneNode | undefined;
  let node: NodeProcess;

  beforeAll(async () => {
    // the task's environment is built once here, in the store the node shares
    await using built = await createTestPlatform('python-client-build');
    const [task] = await loadTasks([join(TASK_ROOT, 'hello-file')]);
    await TaskEnv.create(built.platform, task!).prepare();
    lone = await startLoneNode(`p${tag}`, 231, 7700, ['--warm-pool', '0', '--task-root', TASK_ROOT]);
    node = lone.node;
  });

  afterAll(async () => {
    await lone?.remove();
  });

  function options(pythonPath: string | null) {
    const env = {
      ...process.env,
      // null: the installed package only, nothing of the checkout on the path
      ...(pythonPath === null ? {} : { PYTHONPATH: pythonPath }),
      SANDGYM_URL: `grpc://${node.address}`,
      SANDGYM_TOKEN: NODE_TOKEN,
    };
    return { env, encoding: 'utf8' as const, timeout: 300_000 };
  }

  function python(args: string[], interpreter = PYTHON, pythonPath: string | null = PYTHON_DIR) {
    return spawnSync(interpreter, args, options(pythonPath));
  }

  /** As `python`, leaving this process's event loop free to serve what the script calls. */
  async function pythonServed(args: string[], interpreter: string) {
    return execFileAsync(interpreter, args, options(PYTHON_DIR)).then(
      ({ stdout, stderr }) => ({ status: 0, stdout, stderr }),
      (error: { code?: number; stdout: string; stderr: string }) => ({ ...error, status: error.code ?? -1 }),
    );
  }

  it('passes its own tests against the node: sandboxes, envs, task grading, vector envs, errors', () => {
    const run = python(['-m', 'unittest', 'discover', '-s', join(PYTHON_DIR, 'tests'), '-v']);
    expect(run.status, `${run.stdout}\n${run.stderr}`).toBe(0);
    // every file of python/tests ran (a file that failed to import counts as one failed test)
    expect(run.stderr).toMatch(/Ran \d+ tests/);
    expect(run.stderr).toMatch(/test_client\.ClientTest/);
    expect(run.stderr).toMatch(/test_first_class\.SandboxHandleTest/);
    expect(run.stderr).toMatch(/test_aio\.AsyncClientTest/);
  });

  it("passes Gymnasium's check_env with the real gymnasium of the project's .venv", () => {
    const venvPython = resolve('.venv', 'bin', 'python');
    const run = python(['-m', 'unittest', '-v', join(PYTHON_DIR, 'tests', 'test_gym.py')], venvPython);
    expect(run.status, `${run.stdout}\n${run.stderr}`).toBe(0);
    // ran, not skipped: scripts/prepare.sh --for-tests installs gymnasium there
    expect(run.stderr).toMatch(/test_check_env_passes \(.*\) \.\.\. ok/);
    expect(run.stderr).toMatch(/test_vector_env_batches_and_autoresets_next_step \(.*\) \.\.\. ok/);
  });

  it('installs offline with pip and Debian setuptools, typed, and runs from the install', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'sandgym-pip-'));
    try {
      // a copy, so the build leaves nothing in the checkout
      await cp(PYTHON_DIR, join(dir, 'src'), { recursive: true, filter: (p) => !p.includes('__pycache__') });
      const venv = join(dir, 'venv');
      const made = spawnSync(PYTHON, ['-m', 'venv', '--system-site-packages', venv], { encoding: 'utf8' });
      expect(made.status, made.stderr).toBe(0);
      const pip = [
        '-m',
        'pip',
        'install',
        '--no-index',
        '--no-build-isolation',
        '--disable-pip-version-check',
      ];
      const installed = spawnSync(join(venv, 'bin', 'python'), [...pip, join(dir, 'src')], {
        encoding: 'utf8',
        cwd: dir,
      });
      expect(installed.status, `${installed.stdout}\n${installed.stderr}`).toBe(0);
      const check = [
        'import importlib.resources as r, sandgym, sandgym.aio, sandgym.gym',
        'assert "site-packages" in sandgym.__file__, sandgym.__file__',
        'assert r.files("sandgym").joinpath("py.typed").is_file()',
      ].join('; ');
      const imported = python(['-c', check], join(venv, 'bin', 'python'), null);
      expect(imported.status, imported.stderr).toBe(0);
      const rollout = python(
        [join(dir, 'src', 'examples', 'rollout.py'), `grpc://${node.address}`, 'hello-file'],
        join(venv, 'bin', 'python'),
        null,
      );
      expect(rollout.status, rollout.stderr).toBe(0);
      expect(rollout.stdout).toMatch(/returns: \[1\.0, 1\.0\] after 2 steps/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("runs the README's verifiers sample as written, against the node and a scripted model", async () => {
    // the doc test parses it; it needs a model server, which only this test gives it
    const readme = await readFile(join(PYTHON_DIR, 'README.md'), 'utf8');
    const sample = docSamples('python/README.md', readme).find((s) => s.code.includes('verifiers'));
    expect(sample?.runnable).toBe(false);
    // a model that solves hello-file with chat-completions calls
    await using model = await startFakeModel(() => ({
      calls: [
        {
          id: 'w',
          name: 'write_file',
          arguments: JSON.stringify({ path: '/app/hello.txt', content: 'hello sandgym\n' }),
        },
        { id: 's', name: 'submit', arguments: '{}' },
      ],
    }));
    // the sample names the README's node and model addresses; the test's are elsewhere
    const code = sample!.code
      .replaceAll('grpc://127.0.0.1:7100', `grpc://${node.address}`)
      .replaceAll('http://127.0.0.1:8000/v1', model.baseUrl);
    const run = await pythonServed(['-c', code], resolve('.venv', 'bin', 'python'));
    expect(run.status, `${code}\n${run.stderr}`).toBe(0);
    expect(run.stdout).toBe('hello-file [1.0]\n');
  });

  it('runs the rollout example to the end', () => {
    const run = python([join(PYTHON_DIR, 'examples', 'rollout.py'), `grpc://${node.address}`, 'hello-file']);
    expect(run.status, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/returns: \[1\.0, 1\.0\] after 2 steps/);
  });
});
