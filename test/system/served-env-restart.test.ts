import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { join, resolve } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError, silentLogger } from '../../src/common/index.ts';
import { TaskEnv, loadTasks } from '../../src/env/index.ts';
import { Controller } from '../../src/platform/index.ts';
import { ENVS, SANDBOXES, WireClient } from '../../src/platform/wire/index.ts';
import { PYTHON } from '../../benchmarks/python-client.ts';
import { expectCode } from '../support/errors.ts';
import { NODE_TOKEN, startLoneNode, type LoneNode, type NodeProcess } from '../support/cluster.ts';
import { createTestPlatform } from '../support/platform.ts';

const TASK_ROOT = resolve('examples/tasks');

const TOKEN = 'restart-tenant-token-7d2f9b4e1a6c3850';
const OTHER = 'other-tenant-token-3c5e7a9b1d2f4068';
const BUSYBOX = { kind: 'sandbox', sandbox: { environment: 'busybox:latest' } } as const;
const append = (word: string) => ({ type: 'exec', command: `echo ${word} >> /root/log` });

/**
 * A served env outlives its node's crash: the node records each env on its data dir, adopts the env's
 * sandbox when it starts again, and rebuilds the env at its first call, so the episode goes on
 * in the same sandbox with every step run exactly once (the sandbox's trajectory log answers for
 * a step whose answer was lost). Clients reach the node through a controller.
 */
describe('a served env across node restarts', () => {
  const tag = randomBytes(2).toString('hex');
  let lone: LoneNode | undefined;
  let node: NodeProcess;
  let controller: Controller;
  let envs: WireClient<typeof ENVS>;
  let sandboxes: WireClient<typeof SANDBOXES>;

  beforeAll(async () => {
    // the task's environment is built once here, in the store the node shares
    await using built = await createTestPlatform('served-env-restart-build');
    const [task] = await loadTasks([join(TASK_ROOT, 'hello-file')]);
    await TaskEnv.create(built.platform, task!).prepare();
    lone = await startLoneNode(`r${tag}`, 241, 7800, ['--warm-pool', '0', '--task-root', TASK_ROOT]);
    node = lone.node;
    controller = await Controller.start({
      listen: '127.0.0.1:0',
      nodes: [node.address],
      nodeToken: NODE_TOKEN,
      grants: {
        [TOKEN]: { project: 'restarts', maxSandboxes: 8 },
        [OTHER]: { project: 'other', maxSandboxes: 8 },
      },
      logger: silentLogger(),
      pollMs: 200,
    });
    envs = new WireClient(`127.0.0.1:${controller.port}`, ENVS, { token: TOKEN });
    sandboxes = new WireClient(`127.0.0.1:${controller.port}`, SANDBOXES, { token: TOKEN });
  });

  afterAll(async () => {
    envs?.close();
    sandboxes?.close();
    await controller?.close();
    await lone?.remove();
  });

  async function kill(process: NodeProcess): Promise<void> {
    const died = once(process.child, 'exit');
    process.child.kill('SIGKILL');
    await died;
  }

  /** Once the node answers for the sandbox again through the controller (it restarted). */
  async function untilBack(sandboxId: string): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await sandboxes.call('Describe', { sandboxId });
        return;
      } catch (error) {
        if (!isSandgymError(error, 'node_lost') || attempt > 300) throw error;
        await delay(100);
      }
    }
  }

  it('goes on after a crash, and answers a step whose answer was lost with its record', async () => {
    const { envId } = await envs.call('Make', { spec: BUSYBOX });
    try {
      const reset = await envs.call('Reset', { envId });
      const sandboxId = reset.info['sandboxId'] as string;
      await envs.call('Step', { envId, stepIndex: 0, action: append('one') });
      // killed (its envs stay recorded, its sandboxes run on), then started again with the next
      // step's answer to be lost
      await kill(node);
      await node.restart({ SANDGYM_FAULT_POINTS: 'step.after-record' });
      await untilBack(sandboxId);
      const died = once(node.child, 'exit');
      // the node dies with the step recorded and its answer unsent
      await expectCode(envs.call('Step', { envId, stepIndex: 1, action: append('two') }), 'node_lost');
      await died;
      await node.restart();
      await untilBack(sandboxId);
      // recorded, it is still its project's alone: another's call neither reaches nor rebuilds it
      const other = new WireClient(`127.0.0.1:${controller.port}`, ENVS, { token: OTHER });
      try {
        const read = { type: 'read_file', path: '/root/log' };
        await expectCode(other.call('Step', { envId, stepIndex: 2, action: read }), 'not_found');
        await expectCode(other.call('Close', { envId }), 'not_found');
      } finally {
        other.close();
      }
      // the rebuilt env holds to what the log says step 1 was
      await expectCode(envs.call('Step', { envId, stepIndex: 1, action: append('three') }), 'divergence');
      const retried = await envs.call('Step', { envId, stepIndex: 1, action: append('two') });
      expect(retried.info).toMatchObject({ stepIndex: 1, replayed: true });
      const read = await envs.call('Step', {
        envId,
        stepIndex: 2,
        action: { type: 'read_file', path: '/root/log' },
      });
      expect(read.observation).toMatchObject({ content: 'one\ntwo\n' });
      expect(read.info).toMatchObject({ stepIndex: 2, replayed: false });
    } finally {
      await envs.call('Close', { envId });
    }
  });

  it('goes on with a chat episode after a crash, each of its calls run once', async () => {
    const { envId } = await envs.call('Make', { spec: BUSYBOX });
    const call = (word: string) =>
      `<tool_call>{"name": "exec", "arguments": {"command": "echo ${word} >> /root/log"}}</tool_call>`;
    try {
      const reset = await envs.call('ChatReset', { envId, chat: { maxTurns: 5 } });
      const sandboxId = reset.info['sandboxId'] as string;
      const first = await envs.call('ChatStep', { envId, turn: 0, answer: call('one') });
      await kill(node);
      await node.restart({ SANDGYM_FAULT_POINTS: 'step.after-record' });
      await untilBack(sandboxId);
      // the turn whose answer was lost before the crash answers with its record
      const again = await envs.call('ChatStep', { envId, turn: 0, answer: call('one') });
      expect(again.messages).toEqual(first.messages);
      expect(again.info).toMatchObject({ replayed: true, turns: 1 });
      // the node dies inside the next turn, its first call recorded and its second never run
      const died = once(node.child, 'exit');
      const turn = `${call('two')}${call('three')}`;
      await expectCode(envs.call('ChatStep', { envId, turn: 1, answer: turn }), 'node_lost');
      await died;
      await node.restart();
      await untilBack(sandboxId);
      // rebuilt, the turn holds to what its first call was, and the retry runs only the rest
      await expectCode(envs.call('ChatStep', { envId, turn: 1, answer: call('four') }), 'divergence');
      const retried = await envs.call('ChatStep', { envId, turn: 1, answer: turn });
      expect(retried.info).toMatchObject({ turns: 2 });
      const read = await envs.call('ChatStep', {
        envId,
        turn: 2,
        answer: '<tool_call>{"name": "read_file", "arguments": {"path": "/root/log"}}</tool_call>',
      });
      expect(read.messages[0]).toMatchObject({ content: 'one\ntwo\nthree\n' });
      expect(read.info).toMatchObject({ turns: 3, replayed: false });
    } finally {
      await envs.call('Close', { envId });
    }
  });

  it('grades a task env after a crash, on what the agent did before it', async () => {
    const { envId } = await envs.call('Make', { spec: { kind: 'task', path: 'hello-file' } });
    try {
      const reset = await envs.call('Reset', { envId });
      const sandboxId = reset.info['sandboxId'] as string;
      const write = { type: 'write_file', path: '/app/hello.txt', content: 'hello sandgym\n' };
      await envs.call('Step', { envId, stepIndex: 0, action: write });
      await kill(node);
      await node.restart();
      await untilBack(sandboxId);
      // an index past the log is refused, and leaves the rebuilt env where its log ends
      await expectCode(
        envs.call('Step', { envId, stepIndex: 7, action: { type: 'submit' } }),
        'invalid_argument',
        /out of order: the next step is 1/,
      );
      const submitted = await envs.call('Step', { envId, stepIndex: 1, action: { type: 'submit' } });
      expect(submitted).toMatchObject({ terminated: true, reward: 1, outcome: { kind: 'ok' } });
      expect(submitted.info).toMatchObject({ stepIndex: 1, replayed: false });
    } finally {
      await envs.call('Close', { envId });
    }
  });

  it("carries a Python client's env through a killed node, by the client's own retry", async () => {
    const child = spawn(PYTHON, [join(import.meta.dirname, '..', 'support', 'env_across_restart.py')], {
      env: {
        ...process.env,
        PYTHONPATH: resolve('python'),
        SANDGYM_URL: `grpc://127.0.0.1:${controller.port}`,
        SANDGYM_TOKEN: TOKEN,
      },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let output = '';
    let errors = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (errors += chunk.toString()));
    const exited = once(child, 'exit');
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.on('data', () => output.includes('stepped\n') && resolve());
        void exited.then(() => reject(new Error(`the Python client ended early: ${errors}`)));
      });
      await kill(node);
      // its next step meets the dead node, and waits for it
      child.stdin.end('go\n');
      await node.restart();
      const [code] = (await exited) as [number | null];
      expect(code, errors).toBe(0);
      const last = JSON.parse(output.trim().split('\n').at(-1)!) as {
        observation: { stdout: string };
        info: { stepIndex: number };
      };
      expect(last.observation.stdout).toBe('before\n');
      expect(last.info.stepIndex).toBe(1);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });
});
