import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadHarborTask, loadTasks } from '../../src/env/index.ts';
import { Platform, type RemotePlatform } from '../../src/platform/index.ts';
import { startInProcessCluster, type InProcessCluster } from '../support/in-process-cluster.ts';
import { evaluate, nopAgent, oracleAgent } from '../../src/rollout/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const EXAMPLES = resolve('examples/tasks');

describe('task environments and evaluation over the cluster client', () => {
  let builder: TestPlatform;
  let nodeData: TestPlatform;
  let cluster: InProcessCluster;
  let platform: RemotePlatform;

  beforeAll(async () => {
    // one machine builds the task environments into the store the node shares, for the project
    // whose token the cluster client holds
    builder = await createTestPlatform('remote-eval-build', {
      privateStore: true,
      seed: ['debian:bookworm'],
      project: 'evals',
    });
    const tasks = await loadTasks([EXAMPLES]);
    for (const task of tasks) await TaskEnv.create(builder.platform, task).prepare();
    nodeData = await createTestPlatform('remote-eval-node', { nodeId: 'evalnode' });
    cluster = await startInProcessCluster({
      dataDir: nodeData.dataDir,
      storeDir: join(builder.dataDir, 'store'),
      nodeId: 'evalnode',
      // Harbor tasks ask for the public network: the operator grants the node's mirrors
      grants: {
        'eval-token': {
          project: 'evals',
          maxSandboxes: 20,
          network: ['internet', 'mirror:debian', 'mirror:npm', 'dns'],
        },
      },
    });
    platform = await Platform.connect(cluster.url, { token: 'eval-token' });
  });

  afterAll(async () => {
    for (const step of [
      () => platform?.close(),
      () => cluster?.close(),
      async () => nodeData?.[Symbol.asyncDispose](),
      async () => builder?.[Symbol.asyncDispose](),
    ]) {
      await step()?.catch((error: unknown) => console.error(error));
    }
  });

  it('resolves every example with the oracle and none with nop, graded in fresh boxes on the node', async () => {
    const tasks = await loadTasks([EXAMPLES]);
    const oracle = await evaluate(platform, tasks, oracleAgent, { concurrency: 2 });
    expect(oracle.map((r) => [r.task, r.reward, r.outcome.kind])).toEqual(tasks.map((t) => [t.id, 1, 'ok']));
    const nop = await evaluate(platform, tasks, nopAgent, { concurrency: 2 });
    expect(nop.map((r) => r.reward)).toEqual(tasks.map(() => 0));
    expect(await platform.listSandboxes()).toEqual([]);
  });

  it('checkpoints and restores a task episode through the wire, tamper signals kept', async () => {
    await using task = TaskEnv.create(platform, await loadHarborTask(join(EXAMPLES, 'hello-file')));
    await task.reset();
    await task.step({ type: 'write_file', path: '/app/hello.txt', content: 'hello sandgym\n' });
    await task.step({ type: 'exec', command: 'mkdir -p /tests && echo forged > /tests/test.sh' });
    const checkpoint = await task.checkpoint();
    expect(checkpoint.tampered).toEqual(['/tests']);
    await task.step({ type: 'exec', command: 'rm /app/hello.txt' });
    await task.restore(checkpoint);
    const submitted = await task.step({ type: 'submit' });
    expect(submitted.reward).toBe(1);
    expect((submitted.info.grade as { tampered: string[] }).tampered).toEqual(['/tests']);
  });

  it('says what to do when a cluster client meets a task whose environment was never built', async () => {
    const task = await loadHarborTask(join(EXAMPLES, 'hello-file'));
    const unbuilt = { ...task, id: 'never-built' };
    await expect(TaskEnv.create(platform, unbuilt).prepare()).rejects.toThrow(
      /cannot build.*on a node that shares the store/,
    );
  });
});
