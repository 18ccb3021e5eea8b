import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/common/index.ts';
import { Controller, type ProjectGrant } from '../../src/platform/index.ts';
import {
  ENVS,
  NETWORK_GRANT_KEY,
  PROJECT_KEY,
  SANDBOXES,
  WireClient,
} from '../../src/platform/wire/index.ts';
import { expectCode } from '../support/errors.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';
import { attack } from './summary.ts';

const BUSYBOX = { kind: 'sandbox', sandbox: { environment: 'busybox:latest' } } as const;
const TOKENS = { alpha: 'alpha-token-5f1c9e3a7b2d4680', beta: 'beta-token-0a8e6c4f2d1b3957' };
const GRANTS: Record<string, ProjectGrant> = {
  [TOKENS.alpha]: { project: 'alpha', maxSandboxes: 2 },
  [TOKENS.beta]: { project: 'beta', maxSandboxes: 4 },
};

/**
 * Tenants of a controller's Envs service: each env call reaches the node its id names as the
 * caller's project, so another project's env is as missing as one never made, and a Make is
 * held to the project's quota and network grant like a create.
 */
describe('served envs through a controller, under hostile tenants', () => {
  const dataDir = join(TEST_DATA_ROOT, `envs-controller-${randomBytes(3).toString('hex')}`);
  let cluster: InProcessCluster;
  const clients: { close(): void }[] = [];

  const through = (address: string, token: string) => {
    const envs = new WireClient(address, ENVS, { token });
    const sandboxes = new WireClient(address, SANDBOXES, { token });
    clients.push(envs, sandboxes);
    return { envs, sandboxes };
  };

  beforeAll(async () => {
    cluster = await startInProcessCluster({
      dataDir,
      storeDir: STORE_DIR,
      nodeId: 'envsctl',
      grants: GRANTS,
      envs: { taskRoot: join(dataDir, 'tasks') },
    });
  });

  /** Another controller replica over the node; it knows only what the node reports. */
  const replica = () =>
    Controller.start({
      listen: '127.0.0.1:0',
      nodes: [`127.0.0.1:${cluster.node.port}`],
      nodeToken: IN_PROCESS_NODE_TOKEN,
      grants: GRANTS,
      logger: silentLogger(),
    });

  afterAll(async () => {
    for (const client of clients) client.close();
    await cluster?.close();
    await rm(dataDir, { recursive: true, force: true });
  });

  it("steps a project's own env, and never another project's, guessed or taken", () =>
    attack('tenant', "reach another project's env through the controller", async () => {
      const address = `127.0.0.1:${cluster.controller.port}`;
      const alpha = through(address, TOKENS.alpha);
      const beta = through(address, TOKENS.beta);
      const { envId } = await alpha.envs.call('Make', { spec: BUSYBOX });
      try {
        // the env lives on the node the controller placed it on, and its id says which
        expect(envId).toMatch(/^env-envsctl-[a-z0-9]{12}$/);
        await alpha.envs.call('Reset', { envId });
        const wrote = await alpha.envs.call('Step', {
          envId,
          stepIndex: 0,
          action: { type: 'exec', command: 'echo secret > /root/s' },
        });
        expect(wrote.outcome).toEqual({ kind: 'ok' });
        const read = { type: 'read_file', path: '/root/s' };
        // taken from alpha: every call is beta's, and beta has no such env
        await expectCode(beta.envs.call('Step', { envId, stepIndex: 1, action: read }), 'not_found');
        await expectCode(beta.envs.call('Reset', { envId }), 'not_found');
        await expectCode(beta.envs.call('Checkpoint', { envId }), 'not_found');
        await expectCode(beta.envs.call('Close', { envId }), 'not_found');
        // guessed: on the node, on a node no one knows, or no env id at all
        for (const guess of ['env-envsctl-aaaaaaaaaaaa', 'env-elsewhere-aaaaaaaaaaaa'])
          await expectCode(beta.envs.call('Step', { envId: guess, stepIndex: 0, action: read }), 'not_found');
        await expectCode(beta.envs.call('Close', { envId: 'sg-envsctl-aaaaaaaaaaaa' }), 'invalid_argument');
        // the honest twin: alpha's episode goes on where it was
        const mine = await alpha.envs.call('Step', { envId, stepIndex: 1, action: read });
        expect(mine.observation).toMatchObject({ content: 'secret\n' });
      } finally {
        await alpha.envs.call('Close', { envId });
      }
    }));

  it("holds envs to the project's quota, counted as sandboxes, across controller restarts", () =>
    attack('tenant', 'exceed a sandbox quota by making envs', async () => {
      // a replica of its own: what others placed for alpha before cannot count here
      const first = await replica();
      const alpha = through(`127.0.0.1:${first.port}`, TOKENS.alpha);
      const made: string[] = [];
      try {
        // two envs fill alpha's quota of 2: one with its sandbox, one between episodes
        made.push((await alpha.envs.call('Make', { spec: BUSYBOX })).envId);
        made.push((await alpha.envs.call('Make', { spec: BUSYBOX })).envId);
        await alpha.envs.call('Reset', { envId: made[0]! });
        await expectCode(alpha.envs.call('Make', { spec: BUSYBOX }), 'resource_exhausted', /quota/);
        await expectCode(
          alpha.sandboxes.call('Create', { request: { environment: 'busybox:latest' } }),
          'resource_exhausted',
          /quota/,
        );
        // the node reports both envs, so a fresh replica, knowing only what nodes say, agrees
        expect(cluster.node.status().projects['alpha']).toBe(2);
        await first.close();
        const fresh = await replica();
        try {
          const again = through(`127.0.0.1:${fresh.port}`, TOKENS.alpha);
          await expectCode(again.envs.call('Make', { spec: BUSYBOX }), 'resource_exhausted', /quota/);
          // resetting an env it holds replaces its sandbox: within the quota
          await again.envs.call('Reset', { envId: made[1]! });
          await again.envs.call('Reset', { envId: made[1]! });
          // closing one gives its room back (seen by the replicas at their next poll)
          await again.envs.call('Close', { envId: made.pop()! });
          expect(cluster.node.status().projects['alpha']).toBe(1);
        } finally {
          await fresh.close();
        }
      } finally {
        await first.close();
        const owner = through(`127.0.0.1:${cluster.controller.port}`, TOKENS.alpha);
        for (const envId of made) await owner.envs.call('Close', { envId });
      }
    }));

  it("keeps an env's sandboxes within the project's network grant", () =>
    attack('tenant', 'egress beyond the network grant through an env', async () => {
      const alpha = through(`127.0.0.1:${cluster.controller.port}`, TOKENS.alpha);
      const open = {
        kind: 'sandbox',
        sandbox: { environment: 'busybox:latest', network: ['cidr:0.0.0.0/0'] },
      };
      await expectCode(
        alpha.envs.call('Make', { spec: open }),
        'permission_denied',
        /not granted to project alpha/,
      );
      // the node holds the env to the grant its Make came with, for every sandbox it makes later
      const asController = new WireClient(`127.0.0.1:${cluster.node.port}`, ENVS, {
        token: IN_PROCESS_NODE_TOKEN,
        metadata: { [PROJECT_KEY]: 'alpha', [NETWORK_GRANT_KEY]: '[]' },
      });
      clients.push(asController);
      const { envId } = await asController.call('Make', { spec: open });
      try {
        await expectCode(asController.call('Reset', { envId }), 'permission_denied', /not granted/);
      } finally {
        await asController.call('Close', { envId });
      }
    }));
});
