import { mkdir, symlink, cp, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ENVS, WireClient } from '../../src/platform/wire/index.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { expectCode } from '../support/errors.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';
import { attack } from './summary.ts';

const BUSYBOX = { kind: 'sandbox', sandbox: { environment: 'busybox:latest' } } as const;

/**
 * Tenants of a node's Envs service: what one project makes there, another cannot step, close or
 * restore, and a task path cannot leave the node's task root.
 */
describe('served envs under hostile tenants', () => {
  const dataDir = join(TEST_DATA_ROOT, `served-envs-${process.pid}`);
  const taskRoot = join(dataDir, 'tasks');
  let cluster: InProcessCluster;
  let alpha: WireClient<typeof ENVS>;
  let beta: WireClient<typeof ENVS>;

  beforeAll(async () => {
    await mkdir(taskRoot, { recursive: true });
    await cp(resolve('examples/tasks/hello-file'), join(taskRoot, 'hello-file'), { recursive: true });
    // a tenant-shaped trap in the root: a link out of it, to a folder that holds a task
    await cp(resolve('examples/tasks/fix-sum'), join(dataDir, 'outside', 'fix-sum'), { recursive: true });
    await symlink(join(dataDir, 'outside'), join(taskRoot, 'escape'));
    cluster = await startInProcessCluster({
      dataDir,
      storeDir: STORE_DIR,
      nodeId: 'envs',
      grants: {},
      envs: { taskRoot },
    });
    const address = `127.0.0.1:${cluster.node.port}`;
    const as = (project: string) =>
      new WireClient(address, ENVS, {
        token: IN_PROCESS_NODE_TOKEN,
        metadata: { 'sandgym-project': project },
      });
    alpha = as('alpha');
    beta = as('beta');
  });

  afterAll(async () => {
    alpha?.close();
    beta?.close();
    await cluster?.close();
    await rm(dataDir, { recursive: true, force: true });
  });

  it("refuses one project another's env and checkpoints", () =>
    attack('tenant', "step, close and restore another project's served env", async () => {
      const { envId } = await alpha.call('Make', { spec: BUSYBOX });
      try {
        await alpha.call('Reset', { envId });
        await alpha.call('Step', {
          envId,
          stepIndex: 0,
          action: { type: 'exec', command: 'echo secret > /root/s' },
        });
        const { checkpointId } = await alpha.call('Checkpoint', { envId });
        await expectCode(
          beta.call('Step', { envId, stepIndex: 1, action: { type: 'read_file', path: '/root/s' } }),
          'not_found',
        );
        await expectCode(beta.call('Close', { envId }), 'not_found');
        const own = await beta.call('Make', { spec: BUSYBOX });
        await beta.call('Reset', { envId: own.envId });
        await expectCode(beta.call('Restore', { envId: own.envId, checkpointId }), 'not_found');
        await beta.call('Close', { envId: own.envId });
        // alpha's episode goes on where it was
        const read = await alpha.call('Step', {
          envId,
          stepIndex: 1,
          action: { type: 'read_file', path: '/root/s' },
        });
        expect(read.observation).toMatchObject({ content: 'secret\n' });
      } finally {
        await alpha.call('Close', { envId });
      }
    }));

  it("keeps task paths inside the node's task root, through links and ..", () =>
    attack('tenant', 'task path out of the task root', async () => {
      for (const path of ['../outside/fix-sum', '/etc', `${taskRoot}/../outside/fix-sum`])
        await expectCode(
          alpha.call('Make', { spec: { kind: 'task', path } }),
          'invalid_argument',
          /relative to the node's task root, without a "\.\." component/,
        );
      // a link that leads out is as missing as a path that never was: no answer tells them apart
      for (const path of ['escape/fix-sum', 'escape/no-such-task', 'no-such-task'])
        await expectCode(
          alpha.call('Make', { spec: { kind: 'task', path } }),
          'not_found',
          new RegExp(`No task at ${path} under the node's task root$`),
        );
      // the root's own task is served
      const { envId } = await alpha.call('Make', { spec: { kind: 'task', path: 'hello-file' } });
      await alpha.call('Close', { envId });
    }));
});
