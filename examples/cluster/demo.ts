// The cluster on one machine: three `sandgym node` agents, each in a network namespace of its own
// with its own address, behind a `sandgym controller`, all started as an operator would. A
// trainer connects with a token, starts a run, forks a GRPO group across the nodes, steps it,
// publishes training phases, and ends the run. Everything is torn down at the end.
//
//   npm run build && node dist/examples/cluster/demo.js      (as root, after `sandgym setup`)
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { nodeOfSandboxId } from '../../src/common/index.ts';
import { SandboxEnv } from '../../src/env/index.ts';
import { Platform, defaultDataDir, defaultStoreDir } from '../../src/platform/index.ts';
import { TrainingCoordinator } from '../../src/rollout/index.ts';
import {
  CLI,
  createNamespace,
  removeNode,
  startNode,
  type HostInNamespace,
  type NodeProcess,
} from './netns-cluster.ts';

const NODES = 3;
const GROUP = 4;

async function main(): Promise<void> {
  const tag = randomBytes(2).toString('hex');
  const work = join(defaultDataDir(), `cluster-demo-${tag}`);
  const nodeToken = randomBytes(32).toString('hex');
  const clientToken = randomBytes(32).toString('hex');
  const hosts: HostInNamespace[] = [];
  const nodes: NodeProcess[] = [];
  let controller: ReturnType<typeof spawn> | undefined;
  try {
    await mkdir(work, { recursive: true });
    for (let i = 1; i <= NODES; i++) {
      const host = await createNamespace(`d${tag}${i}`, 220 + i);
      hosts.push(host);
      nodes.push(
        await startNode(host, `demo${i}`, 7400, {
          dataDir: join(work, `node${i}`),
          storeDir: defaultStoreDir(defaultDataDir()),
          token: nodeToken,
        }),
      );
      console.log(`node demo${i} listening on ${host.address}:7400 (network namespace ${host.netns})`);
    }
    const grants = join(work, 'grants.json');
    await writeFile(
      grants,
      JSON.stringify({ tokens: { [clientToken]: { project: 'rl', maxSandboxes: 64 } } }),
    );
    controller = spawn(
      process.execPath,
      [
        CLI,
        'controller',
        '--listen',
        '127.0.0.1:0',
        '--nodes',
        nodes.map((n) => n.address).join(','),
        '--grants',
        grants,
      ],
      { env: { ...process.env, SANDGYM_NODE_TOKEN: nodeToken }, stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const started = controller;
    const port = await new Promise<number>((resolve, reject) => {
      createInterface({ input: started.stdout! }).once('line', (line) =>
        resolve((JSON.parse(line) as { port: number }).port),
      );
      started.once('exit', (code) => reject(new Error(`the controller exited with ${code}`)));
    });
    console.log(`controller listening on 127.0.0.1:${port}`);

    await using platform = await Platform.connect(`grpc://127.0.0.1:${port}`, { token: clientToken });
    await using trainer = await TrainingCoordinator.start(platform, { name: 'grpo-demo', leaseMs: 10_000 });
    trainer.phases$.subscribe((p) =>
      console.log(`phase ${p.phase}: ${JSON.stringify({ ...p.report, phase: undefined })}`),
    );

    // one prompt's sandbox, prepared once, then forked into a group that lands across the nodes
    const prompt = await platform.createSandbox({ environment: 'debian:bookworm', run: trainer.name });
    await prompt.writeFile('/work/prompt.txt', 'compute 6*7\n');
    const group = await platform.fork(prompt, GROUP);
    console.log(
      `forked ${GROUP} sandboxes on nodes ${group.sandboxes.map((s) => nodeOfSandboxId(s.id)).join(', ')}`,
    );

    // each member answers on its own, one logged step at a time
    const rewards = await Promise.all(
      group.sandboxes.map(async (sandbox, i) => {
        const env = await SandboxEnv.attach(platform, sandbox, `episode-${i}`);
        const answer = i % 2 === 0 ? 'print(6*7)' : 'print(6+7)';
        const step = await env.step({ type: 'exec', command: ['python3', '-c', answer] });
        return step.observation.type === 'exec' && step.observation.stdout.trim() === '42' ? 1 : 0;
      }),
    );
    console.log(`group rewards: ${rewards.join(' ')}`);

    await trainer.phase('train'); // the trainer is busy: idle sandboxes freeze
    await trainer.phase('rollout'); // and wake for the next rollout
    await trainer.end(); // the run ends: its sandboxes, logs and snapshots go with it
    console.log(`left after the run: ${(await platform.listSandboxes()).length} sandboxes`);
  } finally {
    controller?.kill('SIGTERM');
    for (const node of nodes) await removeNode(node).catch((error: unknown) => console.error(error));
    for (const host of hosts) await host.remove();
    await rm(work, { recursive: true, force: true });
  }
}

await main();
