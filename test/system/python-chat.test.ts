import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadTasks } from '../../src/env/index.ts';
import { NODE_TOKEN, startLoneNode, type LoneNode } from '../support/cluster.ts';
import { createTestPlatform } from '../support/platform.ts';

const PYTHON_DIR = resolve('python');
const TASK_ROOT = resolve('examples/tasks');
/** The project's virtual environment: the trainers' packages the adapters are tested against. */
const VENV_PYTHON = resolve('.venv/bin/python');

/**
 * The Python chat env (sandgym.chat) and its adapters (SkyRL-gym, verifiers) against a real node
 * agent; the verifiers rollouts' model is a scripted server on loopback.
 */
describe('the Python chat env and its trainer adapters', () => {
  const tag = randomBytes(2).toString('hex');
  let lone: LoneNode | undefined;

  beforeAll(async () => {
    // the task's environment is built once here, in the store the node shares
    await using built = await createTestPlatform('python-chat-build');
    const [task] = await loadTasks([join(TASK_ROOT, 'hello-file')]);
    await TaskEnv.create(built.platform, task!).prepare();
    lone = await startLoneNode(`c${tag}`, 236, 7720, ['--warm-pool', '0', '--task-root', TASK_ROOT]);
  });

  afterAll(async () => {
    await lone?.remove();
  });

  it('passes its tests: text and message answers, budgets, parsers, hostile answers, SkyRL-gym, verifiers', () => {
    const run = spawnSync(
      VENV_PYTHON,
      ['-m', 'unittest', 'discover', '-s', join(PYTHON_DIR, 'tests', 'chat'), '-v'],
      {
        env: {
          ...process.env,
          PYTHONPATH: PYTHON_DIR,
          SANDGYM_URL: `grpc://${lone!.node.address}`,
          SANDGYM_TOKEN: NODE_TOKEN,
        },
        encoding: 'utf8',
        timeout: 300_000,
      },
    );
    expect(run.status, `${run.stdout}\n${run.stderr}`).toBe(0);
    expect(run.stderr).toMatch(/Ran 13 tests/);
  });
});
