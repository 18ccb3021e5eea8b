import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadTasks } from '../../src/env/index.ts';
import { NODE_TOKEN, startLoneNode, type LoneNode, type NodeProcess } from '../support/cluster.ts';
import { createTestPlatform } from '../support/platform.ts';
import { PYTHON } from '../../benchmarks/python-client.ts';

const PYTHON_DIR = resolve('python');
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

  function python(args: string[]) {
    return spawnSync(PYTHON, args, {
      env: {
        ...process.env,
        PYTHONPATH: PYTHON_DIR,
        SANDGYM_URL: `grpc://${node.address}`,
        SANDGYM_TOKEN: NODE_TOKEN,
      },
      encoding: 'utf8',
      timeout: 300_000,
    });
  }

  it('passes its own tests against the node: sandboxes, envs, task grading, vector envs, errors', () => {
    const run = python(['-m', 'unittest', 'discover', '-s', join(PYTHON_DIR, 'tests'), '-v']);
    expect(run.status, `${run.stdout}\n${run.stderr}`).toBe(0);
    expect(run.stderr).toMatch(/Ran 9 tests/);
  });

  it('runs the rollout example to the end', () => {
    const run = python([join(PYTHON_DIR, 'examples', 'rollout.py'), `grpc://${node.address}`, 'hello-file']);
    expect(run.status, run.stderr).toBe(0);
    expect(run.stdout).toMatch(/returns: \[1(\.0)?, 1(\.0)?\] after 2 steps/);
  });
});
