import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError, nodeOfSandboxId, silentLogger } from '../../src/common/index.ts';
import { SandboxEnv } from '../../src/env/index.ts';
import { Controller, Platform, type RemotePlatform } from '../../src/platform/index.ts';
import {
  NODE_TOKEN,
  createNamespace,
  removeNode,
  startNode,
  type HostInNamespace,
  type NodeProcess,
} from '../support/cluster.ts';

const TOKEN = 'cluster-test-project-token';
const EPISODES = 6;
const STEPS = 4;
const STEP = { type: 'exec' as const, command: 'date +%s%N >> /tmp/steps; wc -l < /tmp/steps' };

/** Retries a call that failed because a node or controller was briefly away. */
async function retrying<T>(work: () => Promise<T>, attempts = 80): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await work();
    } catch (error) {
      const transient = isSandgymError(error) && (error.retryable || error.code === 'node_lost');
      if (!transient || attempt >= attempts) throw error;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }
}

describe('a cluster of three node agents in their own network namespaces, behind two controllers', () => {
  const tag = randomBytes(2).toString('hex');
  const hosts: HostInNamespace[] = [];
  const nodes: NodeProcess[] = [];
  const controllers: Controller[] = [];
  let platform: RemotePlatform;

  beforeAll(async () => {
    for (let i = 1; i <= 3; i++) hosts.push(await createNamespace(`${tag}${i}`, 200 + i));
    for (const [i, host] of hosts.entries()) nodes.push(await startNode(host, `n${i + 1}${tag}`, 7400));
    for (let i = 0; i < 2; i++) {
      controllers.push(
        await Controller.start({
          listen: '127.0.0.1:0',
          nodes: nodes.map((node) => node.address),
          nodeToken: NODE_TOKEN,
          grants: { [TOKEN]: { project: 'rl', maxSandboxes: 100 } },
          logger: silentLogger(),
          pollMs: 250,
        }),
      );
    }
    // one client over both replicas: when one dies, calls fail over to the other
    platform = await Platform.connect(`grpc://${controllers.map((c) => `127.0.0.1:${c.port}`).join(',')}`, {
      token: TOKEN,
    });
  });

  afterAll(async () => {
    const steps: (() => Promise<unknown>)[] = [
      () => platform?.close() ?? Promise.resolve(),
      ...controllers.map((controller) => () => controller.close()),
      ...nodes.map((node) => () => removeNode(node)),
      ...hosts.map((host) => () => host.remove()),
    ];
    for (const step of steps) await step().catch((error: unknown) => console.error(error));
  });

  it('runs a rollout across the nodes through a node crash and a controller crash, each step exactly once', async () => {
    const envs = Array.from({ length: EPISODES }, () =>
      SandboxEnv.create(platform, {
        sandbox: { environment: 'busybox:latest', resources: { memoryMib: 64 } },
      }),
    );
    try {
      const sandboxIds: string[] = [];
      for (const [i, env] of envs.entries()) {
        const reset = await env.reset({ options: { episodeId: `episode-${i}` } });
        sandboxIds.push(reset.info['sandboxId'] as string);
      }
      const usedNodes = new Set(sandboxIds.map(nodeOfSandboxId));
      expect(usedNodes.size, `placement spread ${sandboxIds.join(' ')}`).toBeGreaterThanOrEqual(2);

      const stepAll = async (): Promise<void> => {
        await Promise.all(envs.map((env) => retrying(() => env.step(STEP))));
      };
      await stepAll();
      await stepAll();

      // a node agent crashes between steps and comes back on the same data dir
      const victimId = nodeOfSandboxId(sandboxIds[0] as string);
      const victim = nodes.find((node) => node.nodeId === victimId) as NodeProcess;
      const crashed = new Promise((resolve) => victim.child.once('exit', resolve));
      victim.child.kill('SIGKILL');
      await crashed;
      // while it is down, its sandboxes' calls fail as node_lost, never hang
      const down = await envs[0]!.current!.stats().then(
        () => 'answered',
        (error: unknown) => (isSandgymError(error) ? error.code : String(error)),
      );
      expect(['node_lost', 'answered']).toContain(down);
      await victim.restart();

      // and a controller replica dies: the client carries on through the other one
      await controllers[0]!.close();

      await stepAll();
      await stepAll();

      for (const [i, env] of envs.entries()) {
        const sandbox = env.current!;
        const lines = (await retrying(() => sandbox.readFile('/tmp/steps'))).toString().trim().split('\n');
        expect(lines, `episode ${i} on ${sandbox.id}`).toHaveLength(STEPS);
        const records = await retrying(async () => (await platform.stepLog(sandbox.id)).records());
        expect(records.filter((r) => r.episodeId === `episode-${i}`)).toHaveLength(STEPS);
      }

      // a trainer that restarts re-attaches and fast-forwards: every logged step replays, none reruns
      const again = await SandboxEnv.attach(
        platform,
        await platform.attachSandbox(sandboxIds[0]!),
        'episode-0',
      );
      for (let step = 0; step < STEPS; step++) {
        const replay = await again.step(STEP);
        expect(replay.info['replayed']).toBe(true);
      }
      expect((await envs[0]!.current!.readFile('/tmp/steps')).toString().trim().split('\n')).toHaveLength(
        STEPS,
      );
    } finally {
      await Promise.all(envs.map((env) => env.close().catch(() => undefined)));
    }
    expect(await retrying(() => platform.listSandboxes())).toEqual([]);
  });
});
