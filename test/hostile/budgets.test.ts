import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { cp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import {
  Platform,
  type LocalPlatform,
  type ProjectGrant,
  type RemotePlatform,
  type Sandbox,
  type StepRequest,
} from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import { startInProcessCluster, type InProcessCluster } from '../support/in-process-cluster.ts';
import {
  SandboxEnv,
  loadHarborTask,
  type SandboxAction,
  type SandboxObservation,
  type StepInfo,
  type StepResult,
  type Task,
} from '../../src/env/index.ts';
import { evaluate, scriptedAgent, type EpisodeReport } from '../../src/rollout/index.ts';
import {
  STORE_DIR,
  TEST_DATA_ROOT,
  createTestPlatform,
  smallVolumePlatform,
  type TestPlatform,
} from '../support/platform.ts';
import { attack } from './summary.ts';

const MIB = 2 ** 20;
const CLI = resolve('dist/src/cli/main.js');
const FLOOD_CLIENT = resolve('test/support/flood-client.mjs');
const NODE_TOKEN = 'budgets-node-token-7c1e9a3f5b2d4068';
const TOKENS = {
  alpha: 'alpha-token-3d5f7b9e1c2a4680',
  beta: 'beta-token-8e6c4a2f0d1b3579',
  gamma: 'gamma-token-1a3c5e7b9d2f4680',
};
/** Each project's budget of request bodies in flight, on the controller and on the node. */
const BUDGET_MIB = 160;
/**
 * What a server process may hold for each byte of request body in flight: the transport's
 * chunks, the framed message, and its decoded and re-encoded copies on the way to the next hop.
 * Measured: 3.3 (a controller forwarding 128 MiB of WriteFiles peaked 526 MiB over its start).
 */
const COPIES = 4;
/** Memory a server's resident size may move by without any large call (its heap, caches). */
const SLACK_MIB = 128;

const SANDBOXES = '/sandgym.v1.Sandboxes';

/** A server started the way operators start one: the installed command, its own #! line included. */
interface Server {
  child: ChildProcess;
  port: number;
  stop(): Promise<void>;
}

async function startServer(args: string[]): Promise<Server> {
  const child = spawn(CLI, [...args, '--log-level', 'error'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((found, fail) => {
    let text = '';
    child.stdout.on('data', (chunk: Buffer) => {
      text += chunk.toString();
      const match = /"port":(\d+)/.exec(text);
      if (match) found(Number(match[1]));
    });
    child.once('exit', (code) => fail(new Error(`sandgym ${args[0]} exited with ${code}`)));
  });
  return {
    child,
    port,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((done) => child.once('exit', done));
      child.kill('SIGTERM');
      await exited;
    },
  };
}

/** A process's resident memory now (`VmRSS`) or at its peak since {@link resetPeak} (`VmHWM`), in MiB. */
function memoryMib(server: Server, key: 'VmRSS' | 'VmHWM'): number {
  const status = readFileSync(`/proc/${server.child.pid}/status`, 'utf8');
  const kib = new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)?.[1];
  return Number(kib) / 1024;
}

function resetPeak(server: Server): void {
  writeFileSync(`/proc/${server.child.pid}/clear_refs`, '5');
}

interface FloodCall {
  method: string;
  count: number;
  mib: number;
  target: string;
}

/** Fires every call at once from a process of its own; each call's gRPC code and details. */
async function flood(
  address: string,
  token: string,
  project: string,
  calls: FloodCall[],
  compression?: 'gzip',
): Promise<{ code: number; details?: string }[]> {
  const args = [
    FLOOD_CLIENT,
    address,
    token,
    project,
    JSON.stringify(calls),
    ...(compression ? [compression] : []),
  ];
  const output = await new Promise<string>((done, fail) => {
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let text = '';
    child.stdout.on('data', (chunk: Buffer) => (text += chunk.toString()));
    child.on('exit', () => done(text));
    child.on('error', fail);
  });
  return JSON.parse(output) as { code: number; details?: string }[];
}

/** Sixteen calls of 60 to 64 MiB at once, over every method that takes large bodies. */
function largeCalls(sandboxId: string): FloodCall[] {
  return [
    { method: `${SANDBOXES}/WriteFile`, count: 6, mib: 64, target: sandboxId },
    { method: `${SANDBOXES}/ExecCollected`, count: 3, mib: 64, target: sandboxId },
    { method: `${SANDBOXES}/Exec`, count: 2, mib: 64, target: sandboxId },
    { method: `${SANDBOXES}/Step`, count: 5, mib: 60, target: sandboxId },
  ];
}

/** Small calls an honest tenant makes while another floods: each must succeed. */
async function honestCalls(sandbox: Sandbox, rounds: number): Promise<void> {
  for (let round = 0; round < rounds; round++) {
    await sandbox.writeFile(`/note-${round}`, `note ${round}\n`);
    expect((await sandbox.exec(['cat', `/note-${round}`])).stdout).toBe(`note ${round}\n`);
  }
}

/**
 * Tenants flooding a controller and a node with large request bodies: what the servers hold for
 * them stays within each project's budget however many calls they make at once, another project
 * keeps working, and the memory comes back when the calls end.
 */
describe('request bodies in flight', () => {
  const dataDir = join(TEST_DATA_ROOT, `budgets-${process.pid}`);
  let node: Server;
  let controller: Server;
  const clients: Partial<Record<keyof typeof TOKENS, RemotePlatform>> = {};
  const sandboxes: Partial<Record<keyof typeof TOKENS, Sandbox>> = {};

  beforeAll(async () => {
    await mkdir(dataDir, { recursive: true });
    await writeFile(join(dataDir, 'node-token'), NODE_TOKEN, { mode: 0o600 });
    const grants = Object.fromEntries(
      Object.entries(TOKENS).map(([project, token]) => [
        token,
        { project, maxSandboxes: 4, maxInFlightBytes: BUDGET_MIB * MIB },
      ]),
    );
    await writeFile(join(dataDir, 'grants.json'), JSON.stringify({ tokens: grants }));
    node = await startServer([
      'node',
      ...['--listen', '127.0.0.1:0', '--node-id', 'budgets', '--warm-pool', '0'],
      ...['--data-dir', join(dataDir, 'node'), '--store', STORE_DIR],
      ...['--node-token-file', join(dataDir, 'node-token'), '--max-in-flight-mib', String(BUDGET_MIB)],
    ]);
    controller = await startServer([
      'controller',
      ...['--listen', '127.0.0.1:0', '--nodes', `127.0.0.1:${node.port}`],
      ...['--grants', join(dataDir, 'grants.json'), '--node-token-file', join(dataDir, 'node-token')],
    ]);
    for (const [project, token] of Object.entries(TOKENS) as [keyof typeof TOKENS, string][]) {
      const client = await Platform.connect(`grpc://127.0.0.1:${controller.port}`, { token });
      clients[project] = client;
      sandboxes[project] = await client.createSandbox({
        environment: 'busybox:latest',
        resources: { diskMib: 2048 },
      });
    }
  });

  afterAll(async () => {
    for (const step of [
      ...Object.values(sandboxes).map((sandbox) => () => sandbox.close()),
      ...Object.values(clients).map((client) => () => client.close()),
      () => controller?.stop(),
      () => node?.stop(),
      () => rm(dataDir, { recursive: true, force: true }),
    ]) {
      await step().catch((error: unknown) => console.error(error));
    }
  });

  /** Runs `attack` with both servers' peaks measured; then waits for their memory to come back. */
  async function measured(attackWith: () => Promise<void>): Promise<{ node: number; controller: number }> {
    const before = { node: memoryMib(node, 'VmRSS'), controller: memoryMib(controller, 'VmRSS') };
    resetPeak(node);
    resetPeak(controller);
    await attackWith();
    const grew = {
      node: memoryMib(node, 'VmHWM') - before.node,
      controller: memoryMib(controller, 'VmHWM') - before.controller,
    };
    // the bodies are freed when their calls end, and the memory goes back to the system
    await vi.waitFor(
      () => {
        expect(memoryMib(node, 'VmRSS') - before.node).toBeLessThan(SLACK_MIB);
        expect(memoryMib(controller, 'VmRSS') - before.controller).toBeLessThan(SLACK_MIB);
      },
      { timeout: 60_000, interval: 500 },
    );
    return grew;
  }

  it('holds a flood through the controller to its budget while another project works', () =>
    attack('budgets', '16 concurrent 64 MiB bodies through the controller', async () => {
      let results: { code: number; details?: string }[] = [];
      const grew = await measured(async () => {
        [results] = await Promise.all([
          flood(`127.0.0.1:${controller.port}`, TOKENS.alpha, '-', largeCalls(sandboxes.alpha!.id)),
          honestCalls(sandboxes.beta!, 8),
        ]);
      });
      expect(grew.controller).toBeLessThan(COPIES * BUDGET_MIB + SLACK_MIB);
      expect(grew.node).toBeLessThan(COPIES * BUDGET_MIB + SLACK_MIB);
      const refused = results.filter((result) => result.code !== 0);
      expect(refused.length, JSON.stringify(results)).toBeGreaterThan(0);
      for (const refusal of refused) {
        expect(refusal.code).toBe(8); // RESOURCE_EXHAUSTED
        expect(refusal.details).toMatch(/Project alpha has .* budget is 160 MiB.*maxInFlightBytes/);
      }
      expect(results.some((result) => result.code === 0)).toBe(true);
    }));

  it('holds floods straight to a node to each project, compressed or not', () =>
    attack('budgets', 'two projects flood a node directly, plain and gzip', async () => {
      const direct = `127.0.0.1:${node.port}`;
      const envStep = {
        method: '/sandgym.v1.Envs/Step',
        count: 4,
        mib: 60,
        target: 'env-budgets-aaaaaaaaaaaa',
      };
      let results: { code: number; details?: string }[][] = [];
      const grew = await measured(async () => {
        [results] = await Promise.all([
          Promise.all([
            flood(direct, NODE_TOKEN, 'alpha', [...largeCalls(sandboxes.alpha!.id), envStep]),
            flood(direct, NODE_TOKEN, 'beta', largeCalls(sandboxes.beta!.id), 'gzip'),
          ]),
          honestCalls(sandboxes.gamma!, 8),
        ]);
      });
      // two projects, each within its own budget
      expect(grew.node).toBeLessThan(COPIES * 2 * BUDGET_MIB + SLACK_MIB);
      for (const [project, outcome] of [
        ['alpha', results[0]],
        ['beta', results[1]],
      ] as const) {
        const refused = (outcome ?? []).filter((result) => result.code === 8);
        expect(refused.length, JSON.stringify(outcome)).toBeGreaterThan(0);
        for (const refusal of refused)
          expect(refusal.details).toMatch(new RegExp(`Project ${project} has .*--max-in-flight-mib`));
      }
    }));

  it('takes a tenant’s normal and largest writes, several at once, without refusing one', async () => {
    const sandbox = sandboxes.gamma!;
    await sandbox.writeFile('/small', 'hello\n');
    expect((await sandbox.readFile('/small')).toString()).toBe('hello\n');
    // the client queues its own large calls, so none meets the server's budget
    const big = Buffer.alloc(64 * MIB, 0x62);
    await Promise.all([0, 1, 2, 3].map((index) => sandbox.writeFile(`/big-${index}`, big)));
    const sizes = await sandbox.exec(['sh', '-c', 'wc -c /big-*']);
    expect(sizes.stdout).toMatch(/268435456 total/);
  });
});

/** A node whose volume one tenant fills and leaves: the next must find the room it left. */
describe('a volume freed by one tenant', () => {
  let volume: Awaited<ReturnType<typeof smallVolumePlatform>>;
  let platform: LocalPlatform;

  beforeAll(async () => {
    volume = await smallVolumePlatform('budgetsvol', 700);
    platform = volume.platform;
  });

  afterAll(async () => {
    await volume?.[Symbol.asyncDispose]();
  });

  it('gives the next tenant the room the last one freed, at once', () =>
    attack('budgets', 'a freed volume stays full for the next tenant', async () => {
      for (const where of ['/fill', '/tmp/fill']) {
        const filler = await platform.createSandbox({ environment: 'busybox:latest' });
        try {
          const fill = await filler.exec(['sh', '-c', `dd if=/dev/zero of=${where} bs=1M count=2000; sync`], {
            timeoutMs: 120_000,
          });
          expect(fill.stderr).toMatch(/No space left|quota exceeded/i);
        } finally {
          await filler.close();
        }
        // no wait: the next create comes as soon as the last sandbox is gone
        await using next = await platform.createSandbox({ environment: 'busybox:latest' });
        const write = await next.exec([
          'sh',
          '-c',
          'dd if=/dev/zero of=/data bs=1M count=100 && sync && echo written',
        ]);
        expect(write.stdout, write.stderr).toBe('written\n');
      }
    }));
});

/**
 * Diffs an agent makes large by their apparent size rather than by what it wrote: sparse files
 * (in its workdir or under /tmp), hard links of them, files just over the cap. Each is scored 0
 * with the reason in the grade, quickly, never packed or masked; honest diffs of the same kinds
 * below the cap grade as usual.
 */
describe('diffs larger than their sandbox', () => {
  /** The hello-file task with a 64 MiB disk cap. */
  let task: Task;
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-budgets-diffs', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
    const dir = join(env.dataDir, 'task');
    await cp(resolve('examples/tasks/hello-file'), dir, { recursive: true });
    const toml = await readFile(join(dir, 'task.toml'), 'utf8');
    await writeFile(
      join(dir, 'task.toml'),
      toml.replace('memory_mb = 512', 'memory_mb = 512\nstorage_mb = 64'),
    );
    task = await loadHarborTask(dir);
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  /** The episode of an agent that solves the task, then runs `shell`. */
  async function solveThen(shell: string): Promise<EpisodeReport> {
    const actions: SandboxAction[] = [
      { type: 'exec', command: 'echo "hello sandgym" > /app/hello.txt' },
      { type: 'exec', command: shell },
    ];
    const [report] = await evaluate(env.platform, [task], () => scriptedAgent(actions), { concurrency: 1 });
    if (!report) throw new Error('no report');
    return report;
  }

  const overCap: Record<string, string> = {
    'a 16 GiB sparse file in the workdir': 'truncate -s 16G /app/data.bin',
    'a 16 GiB sparse file under /tmp': 'truncate -s 16G /tmp/scratch.bin',
    'hard links of a 40 MiB sparse file beside 30 MiB of others':
      'truncate -s 40M /app/a && ln /app/a /app/b && truncate -s 30M /app/c',
    'files just over the 64 MiB cap':
      'head -c 1048576 /dev/urandom > /app/real && truncate -s 64M /app/sparse',
  };
  for (const [name, shell] of Object.entries(overCap)) {
    it(`scores ${name} 0, with the reason in the grade`, () =>
      attack('budgets', `diff over its disk cap: ${name}`, async () => {
        const report = await solveThen(shell);
        expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
        expect(report.reward).toBe(0);
        expect(JSON.stringify(report.details)).toMatch(/more than its disk cap of 64 MiB .* apparent size/);
      }));
  }

  const underCap: Record<string, string> = {
    'a small sparse file': 'truncate -s 8M /app/sparse.db',
    'files just under the cap': 'head -c 1048576 /dev/urandom > /app/real && truncate -s 56M /app/sparse',
    'many hard links of one file':
      'head -c 4194304 /dev/urandom > /app/f && for i in $(seq 1 200); do ln /app/f /app/l$i; done',
  };
  for (const [name, shell] of Object.entries(underCap)) {
    it(`grades a diff with ${name} as usual`, async () => {
      const report = await solveThen(shell);
      expect(report, JSON.stringify(report)).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
    });
  }
});

/**
 * What a node keeps of a sandbox's steps: a sandbox with 16 MiB of disk that prints megabytes per
 * command, or whose tenant sends steps carrying megabytes, must not leave the node a larger log
 * than its disk cap, and the log keeps telling retries from divergent steps.
 */
describe('trajectory logs', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-budgets-logs');
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  const SMALL_DISK = { environment: 'busybox:latest', resources: { diskMib: 16, outputCapBytes: 64 * MIB } };

  function logBytes(sandboxId: string): number {
    return statSync(join(env.dataDir, 'trajectories', `${sandboxId}.log`)).size;
  }

  it('keeps the log of a 16 MiB sandbox within 16 MiB, whatever its steps print or carry', () =>
    attack('budgets', 'huge outputs and huge step actions into a small sandbox log', async () => {
      await using gym = SandboxEnv.create(env.platform, { sandbox: SMALL_DISK });
      await gym.reset();
      const sandboxId = gym.current!.id;
      const loud: SandboxAction = { type: 'exec', command: 'head -c 8000000 /dev/zero | tr "\\0" x' };
      const heavy: SandboxAction = { type: 'write_file', path: '/tmp/heavy', content: 'y'.repeat(12 * MIB) };
      const limits: string[][] = [];
      for (let index = 0; index < 9; index++) {
        const step = await gym.step(index % 3 === 2 ? heavy : loud);
        // the caller gets every output whole; the log keeps what its cap allows
        if (index % 3 !== 2) expect(step.observation).toMatchObject({ stdout: 'x'.repeat(8_000_000) });
        limits.push((step.info.signals as { limitsHit: string[] }).limitsHit);
      }
      expect(limits.at(-1)).toContain('log');
      expect(logBytes(sandboxId)).toBeLessThanOrEqual(16 * MIB);
      await gym.close();
      // and what the node keeps after the sandbox is gone is no more
      expect(logBytes(sandboxId)).toBeLessThanOrEqual(16 * MIB);
    }));

  it('ends the episode, scored, when a sandbox fills its log', () =>
    attack('budgets', 'fill a trajectory log to its end', async () => {
      await using small = await createTestPlatform('hostile-budgets-full-log', {
        trajectoryCapBytes: 256 * 1024,
      });
      await using gym = SandboxEnv.create(small.platform, { sandbox: SMALL_DISK });
      await gym.reset();
      let last: StepResult<SandboxObservation, StepInfo> | undefined;
      for (let index = 0; index < 1000 && !last?.terminated; index++)
        last = await gym.step({ type: 'exec', command: 'head -c 3000 /dev/zero | tr "\\0" x' });
      // the step that found no room did not run, and ended the episode as the agent's doing
      expect(last?.terminated).toBe(true);
      expect(last?.outcome).toEqual({ kind: 'ok' });
      expect(last?.observation).toMatchObject({ type: 'error', code: 'resource_exhausted' });
      expect(JSON.stringify(last?.observation)).toMatch(/trajectory log .* is full.*resources\.diskMib/);
      const log = join(small.dataDir, 'trajectories', `${gym.current!.id}.log`);
      expect(statSync(log).size).toBeLessThanOrEqual(256 * 1024);
      // asked again, that step gets the same answer, still without running
      const again = await small.platform.step(gym.current!, {
        episodeId: last!.info.episodeId,
        stepIndex: last!.info.stepIndex,
        action: { type: 'exec', command: 'touch /ran' },
      });
      expect(again.result.observation).toMatchObject({ code: 'resource_exhausted' });
      expect((await gym.current!.exec(['ls', '/ran'])).exitCode).not.toBe(0);
    }));

  it('still tells a retry of a step it cut from a different step at that index', () =>
    attack('budgets', 'diverge at a step whose logged action was cut', async () => {
      await using sandbox = await env.platform.createSandbox(SMALL_DISK);
      const write = (content: string): StepRequest => ({
        episodeId: 'cut',
        stepIndex: 0,
        action: { type: 'write_file', path: '/tmp/big', content },
      });
      const content = 'z'.repeat(15 * MIB);
      const first = await env.platform.step(sandbox, write(content));
      expect(first.logCapped).toBe(true);
      // the same action again is the logged step, answered from the log
      expect((await env.platform.step(sandbox, write(content))).replayed).toBe(true);
      // one that differs only past what the log kept is not
      await expectCode(env.platform.step(sandbox, write(`${content.slice(0, -1)}!`)), 'divergence');
    }));

  it('logs a normal episode in a small sandbox whole', async () => {
    await using gym = SandboxEnv.create(env.platform, { sandbox: SMALL_DISK });
    await gym.reset();
    for (let index = 0; index < 20; index++) {
      const step = await gym.step({ type: 'exec', command: `echo step ${index}` });
      expect(step.observation).toMatchObject({ stdout: `step ${index}\n` });
      expect(step.info.signals).toMatchObject({ limitsHit: [] });
    }
    const records = await (await env.platform.stepLog(gym.current!.id)).records();
    expect(
      records.map((record) => (record.result as { observation: { stdout: string } }).observation.stdout),
    ).toEqual(Array.from({ length: 20 }, (_, index) => `step ${index}\n`));
  });
});

/**
 * Tenants packing diffs into the shared store: each project's layers and environments stay within
 * its store quota, a refused layer is not left behind, and other projects, and the project's own
 * graders, go on packing.
 */
describe('the shared store', () => {
  const QUOTAS: Record<string, ProjectGrant> = {
    'alpha-store-token-2b4d6f8a0c1e3579': { project: 'alpha', maxSandboxes: 4, maxStoreBytes: 4 * MIB },
    'gamma-store-token-7f5d3b1a9e8c6420': { project: 'gamma', maxSandboxes: 4, maxStoreBytes: 128 * 1024 },
    'delta-store-token-4c6e8a0b2d1f3579': { project: 'delta', maxSandboxes: 4, maxStoreBytes: 3 * MIB },
    'beta-store-token-9a7c5e3b1d0f2468': { project: 'beta', maxSandboxes: 4 },
  };
  let nodeData: TestPlatform;
  let cluster: InProcessCluster;
  const connect = (project: string): Promise<RemotePlatform> => {
    const token = Object.entries(QUOTAS).find(([, grant]) => grant.project === project)![0];
    return Platform.connect(cluster.url, { token });
  };

  beforeAll(async () => {
    nodeData = await createTestPlatform('hostile-budgets-store', { privateStore: true });
    cluster = await startInProcessCluster({
      dataDir: nodeData.dataDir,
      storeDir: join(nodeData.dataDir, 'store'),
      nodeId: 'storenode',
      grants: QUOTAS,
      // a layer nothing references is the project's to lose at once: what a quota collects first
      platform: { freshLayerHoldMs: 0 },
    });
  });

  afterAll(async () => {
    await cluster?.close().catch((error: unknown) => console.error(error));
    await nodeData?.[Symbol.asyncDispose]();
  });

  const layerFiles = (): number =>
    readdirSync(join(nodeData.dataDir, 'store', 'layers', 'sha256')).filter((name) => name.endsWith('.erofs'))
      .length;

  /** Packs `sandbox` as new named environments, changing `size` random bytes each time, until refused. */
  async function packUntilRefused(
    platform: RemotePlatform,
    sandbox: Sandbox,
    size: number,
  ): Promise<unknown> {
    for (let index = 0; index < 200; index++) {
      await sandbox.exec(['sh', '-c', `head -c ${size} /dev/urandom > /blob-${index}`]);
      const refused = await platform.packDiff(sandbox, { name: `blob:v${index}` }).then(
        () => undefined,
        (error: unknown) => error,
      );
      if (refused) return refused;
    }
    throw new Error('never refused');
  }

  for (const [name, project, size] of [
    ['named packDiffs of a megabyte each', 'alpha', MIB],
    ['many small named packDiffs', 'gamma', 64],
  ] as const) {
    it(`keeps ${name} within the project's store quota`, () =>
      attack('budgets', `store quota: ${name}`, async () => {
        await using platform = await connect(project);
        await using sandbox = await platform.createSandbox({ environment: 'busybox:latest' });
        const quota = Object.values(QUOTAS).find((grant) => grant.project === project)!.maxStoreBytes!;
        const refusal = await packUntilRefused(platform, sandbox, size);
        expect(refusal).toMatchObject({ code: 'resource_exhausted', retryable: true });
        expect((refusal as Error).message).toMatch(
          new RegExp(`Project ${project} holds .* store quota.*maxStoreBytes`),
        );
        expect(await cluster.nodePlatform.layers.bytesOf(project)).toBeLessThanOrEqual(quota);
        // refused again, and the refused layers are not left in the store
        const files = layerFiles();
        await expectCode(
          platform.packDiff(sandbox, { name: 'blob:again' }),
          'resource_exhausted',
          /store quota/,
        );
        expect(layerFiles()).toBe(files);
      }));
  }

  it("lets other projects, and a full project's graders, go on packing", async () => {
    // beta has no quota of its own; delta's grader diffs are collected to make room for the next
    await using beta = await connect('beta');
    await using free = await beta.createSandbox({ environment: 'busybox:latest' });
    await free.exec(['sh', '-c', 'head -c 1048576 /dev/urandom > /blob']);
    for (let index = 0; index < 6; index++) await beta.packDiff(free, { name: `beta-blob:v${index}` });
    await using delta = await connect('delta');
    await using graded = await delta.createSandbox({ environment: 'busybox:latest' });
    for (let index = 0; index < 8; index++) {
      await graded.exec(['sh', '-c', `head -c 1048576 /dev/urandom > /work-${index % 2}`]);
      const { layer } = await delta.packDiff(graded, {});
      expect(layer.sizeBytes).toBeGreaterThan(0);
    }
    expect(await cluster.nodePlatform.layers.bytesOf('delta')).toBeLessThanOrEqual(3 * MIB);
  });
});
