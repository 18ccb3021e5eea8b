import { randomBytes } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  SandgymError,
  isSandgymError,
  nodeOfEnvId,
  nodeOfSandboxId,
  silentLogger,
} from '../../src/common/index.ts';
import { SandboxEnv } from '../../src/env/index.ts';
import { Controller, Platform, type RemotePlatform } from '../../src/platform/index.ts';
import { ENVS, WireClient } from '../../src/platform/wire/index.ts';
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
        sandboxIds.push(reset.info.sandboxId);
      }
      const usedNodes = new Set(sandboxIds.map(nodeOfSandboxId));
      expect(usedNodes.size, `placement spread ${sandboxIds.join(' ')}`).toBeGreaterThanOrEqual(2);

      // a step whose node is briefly away comes back as outcome node_lost (unlogged): retry it
      const stepAll = async (): Promise<void> => {
        await Promise.all(
          envs.map((env) =>
            retrying(async () => {
              const result = await env.step(STEP);
              if (result.outcome.kind === 'infra_failure') {
                throw new SandgymError('node_lost', result.outcome.message, { retryable: true });
              }
              return result;
            }),
          ),
        );
      };
      await stepAll();
      await stepAll();

      // a node agent crashes between steps and comes back on the same data dir
      const victimId = nodeOfSandboxId(sandboxIds[0] as string);
      const victim = nodes.find((node) => node.nodeId === victimId) as NodeProcess;
      const crashed = new Promise((resolve) => victim.child.once('exit', resolve));
      victim.child.kill('SIGKILL');
      await crashed;
      // while it is down, a step in one of its sandboxes comes back at once as outcome node_lost,
      // unlogged, and the episode's step index stays for the retry
      const lost = await envs[0]!.step(STEP);
      expect(lost.outcome).toMatchObject({ kind: 'infra_failure', reason: 'node_lost' });
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
        expect(replay.info.replayed).toBe(true);
      }
      expect((await envs[0]!.current!.readFile('/tmp/steps')).toString().trim().split('\n')).toHaveLength(
        STEPS,
      );
    } finally {
      await Promise.all(envs.map((env) => env.close().catch(() => undefined)));
    }
    expect(await retrying(() => platform.listSandboxes())).toEqual([]);
  });

  it("rebuilds a new controller replica's view from the nodes alone", async () => {
    const sandbox = await retrying(() =>
      platform.createSandbox({ environment: 'busybox:latest', resources: { memoryMib: 64 } }),
    );
    try {
      const fresh = await Controller.start({
        listen: '127.0.0.1:0',
        nodes: nodes.map((node) => node.address),
        nodeToken: NODE_TOKEN,
        grants: { [TOKEN]: { project: 'rl', maxSandboxes: 100 } },
        logger: silentLogger(),
      });
      controllers.push(fresh);
      const client = await Platform.connect(`grpc://127.0.0.1:${fresh.port}`, { token: TOKEN });
      try {
        expect((await client.listSandboxes()).map((r) => r.id)).toEqual([sandbox.id]);
        const seen = await client.attachSandbox(sandbox.id);
        expect((await seen.exec(['echo', 'routed'])).stdout).toBe('routed\n');
      } finally {
        await client.close();
      }
    } finally {
      await sandbox.close();
    }
  });

  it('leaves no residue on any node after run.end(), a lease expiry and a group fork', async () => {
    const request = (run: string) => ({ environment: 'busybox:latest', resources: { memoryMib: 64 }, run });
    const ended = await platform.startRun({ name: 'grpo', leaseMs: 60_000 });
    const members = await Promise.all(
      [1, 2, 3, 4].map(() => retrying(() => platform.createSandbox(request('grpo')))),
    );
    await members[0]!.writeFile('/root/prompt', 'same start');
    const group = await platform.fork(members[0]!, 3);
    for (const child of group.sandboxes) {
      expect((await child.readFile('/root/prompt')).toString()).toBe('same start');
    }
    const spread = new Set([...members, ...group.sandboxes].map((s) => nodeOfSandboxId(s.id)));
    expect(spread.size).toBeGreaterThanOrEqual(2);
    const report = await ended.end();
    // the forks joined the run of their source, so the run's end takes them too
    expect(report.destroyed.sort()).toEqual([...members, ...group.sandboxes].map((s) => s.id).sort());

    const lapsing = await platform.startRun({ name: 'abandoned', leaseMs: 300, ttlMs: 700 });
    const orphans = await Promise.all(
      [1, 2, 3].map(() => retrying(() => platform.createSandbox(request(lapsing.name)))),
    );
    const deadline = Date.now() + 30_000;
    while ((await platform.listSandboxes()).length > 0 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    expect(await platform.listSandboxes()).toEqual([]);
    for (const node of nodes) {
      // the node's warm pool stays; a scrubbed container's folder holds no tenant and no upper dir
      const left = await tenantFolders(join(node.dataDir, 'sandboxes'));
      expect(left, `sandbox folders left on ${node.nodeId}`).toEqual([]);
      const logs = await readdir(join(node.dataDir, 'trajectories')).catch(() => [] as string[]);
      for (const sandbox of [...members, ...group.sandboxes, ...orphans]) {
        expect(logs, `trajectory log left on ${node.nodeId}`).not.toContain(`${sandbox.id}.log`);
      }
    }
  });

  it("makes a chat episode's forks on its node, where its checkpoint is, through either replica", async () => {
    const spec = {
      kind: 'sandbox' as const,
      sandbox: { environment: 'busybox:latest', resources: { memoryMib: 64 } },
    };
    // the first replica died in the first test; the last two serve
    const clients = controllers
      .slice(-2)
      .map((c) => new WireClient(`127.0.0.1:${c.port}`, ENVS, { token: TOKEN }));
    const made: { client: WireClient<typeof ENVS>; envId: string }[] = [];
    try {
      const lead = await retrying(() => clients[0]!.call('Make', { spec }));
      made.push({ client: clients[0]!, envId: lead.envId });
      await clients[0]!.call('ChatReset', { envId: lead.envId });
      const write =
        '<tool_call>{"name": "exec", "arguments": {"command": "echo branch > /root/at"}}</tool_call>';
      await clients[0]!.call('ChatStep', { envId: lead.envId, turn: 0, answer: write });
      const { checkpointId } = await clients[0]!.call('Checkpoint', { envId: lead.envId, depth: 'disk' });
      for (const [i, client] of [clients[0]!, clients[1]!, clients[1]!].entries()) {
        const fork = await retrying(() => client.call('Make', { spec, beside: lead.envId }));
        made.push({ client, envId: fork.envId });
        expect(nodeOfEnvId(fork.envId)).toBe(nodeOfEnvId(lead.envId));
        const restored = await client.call('ChatRestore', {
          envId: fork.envId,
          checkpointId,
          options: { episodeId: `fork-${i}` },
        });
        expect(restored.info).toMatchObject({ turns: 1, episodeId: `fork-${i}` });
        const read = await client.call('ChatStep', {
          envId: fork.envId,
          turn: 1,
          answer: '<tool_call>{"name": "read_file", "arguments": {"path": "/root/at"}}</tool_call>',
        });
        expect(read.messages[0]).toMatchObject({ content: 'branch\n' });
      }
    } finally {
      for (const { client, envId } of made) await client.call('Close', { envId }).catch(() => undefined);
      for (const client of clients) client.close();
    }
  });
});

/** Sandbox folders that still belong to a tenant, or still hold an upper dir. */
async function tenantFolders(dir: string): Promise<string[]> {
  const left: string[] = [];
  for (const slot of await readdir(dir).catch(() => [] as string[])) {
    const state = JSON.parse(await readFile(join(dir, slot, 'state.json'), 'utf8').catch(() => '{}')) as {
      pooled?: boolean;
    };
    const files = await readdir(join(dir, slot));
    if (!state.pooled || files.includes('upper')) left.push(slot);
  }
  return left;
}
