import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LayerStore } from '../../src/platform/index.ts';
import { startInProcessCluster, type InProcessCluster } from '../support/in-process-cluster.ts';
import { STORE_DIR, createTestPlatform, type TestPlatform } from '../support/platform.ts';

const CLI = resolve('dist/src/cli/main.js');

interface Listed {
  id: string;
  state: string;
  ownerPid: number;
  labels: Record<string, string>;
}

describe('sandgym create, exec, env rm and mcp --sandbox on this host', () => {
  let test: TestPlatform;
  let env: NodeJS.ProcessEnv;
  /** Every sandbox a test created, killed in its finally (and again here, should one fail). */
  const created = new Set<string>();

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run "npm run build"`);
    test = await createTestPlatform('cliverbs', { privateStore: true });
    // a store of its own, so env rm removes nothing another test uses
    env = {
      ...process.env,
      SANDGYM_DATA_DIR: test.dataDir,
      SANDGYM_STORE: join(test.dataDir, 'store'),
    };
    delete env['SANDGYM_PLATFORM'];
  });

  afterAll(async () => {
    for (const id of created) await killAndWait(id);
    await test?.[Symbol.asyncDispose]();
  });

  function sandgym(
    args: string[],
    input?: string,
  ): { status: number | null; stdout: string; stderr: string } {
    const run = spawnSync('node', [CLI, ...args], { env, encoding: 'utf8', timeout: 120_000, input });
    return { status: run.status, stdout: run.stdout, stderr: run.stderr };
  }

  function ps(): Listed[] {
    return (JSON.parse(sandgym(['ps', '--json']).stdout) as { sandboxes: Listed[] }).sandboxes;
  }

  function create(...args: string[]): { id: string; ownerPid: number } {
    const run = sandgym(['create', '--json', ...args]);
    expect(run.status, run.stderr).toBe(0);
    const record = JSON.parse(run.stdout) as { id: string; ownerPid: number };
    created.add(record.id);
    return record;
  }

  function alive(pid: number): boolean {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  }

  /** Kills a sandbox if it is still there, and waits for its holder to be gone. */
  async function killAndWait(id: string): Promise<void> {
    const listed = ps().find((record) => record.id === id);
    if (listed) sandgym(['kill', id]);
    created.delete(id);
    for (let i = 0; listed && alive(listed.ownerPid) && i < 100; i++) await sleep(100);
  }

  it('creates a sandbox that outlives the command, streams exec output, passes exit codes, and kills it', async () => {
    const { id, ownerPid } = create('--env', 'busybox:latest');
    try {
      expect(ownerPid).not.toBe(process.pid);
      const listed = ps().find((record) => record.id === id);
      expect(listed).toMatchObject({ state: 'running', ownerPid, labels: { environment: 'busybox:latest' } });

      // output streams: the first line arrives while the command still waits for a second exec
      const waiting = spawn(
        'node',
        [
          CLI,
          'exec',
          id,
          '--',
          'sh',
          '-c',
          'echo first; echo warning >&2; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second; exit 7',
        ],
        { env },
      );
      let stdout = '';
      let stderr = '';
      waiting.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
      waiting.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
      const exited = new Promise<number | null>((done) => waiting.once('exit', (code) => done(code)));
      for (let i = 0; !stdout.includes('first') && i < 600; i++) await sleep(100);
      expect(stdout).toBe('first\n');
      expect(sandgym(['exec', id, '--', 'touch', '/tmp/go']).status).toBe(0);
      expect(await exited).toBe(7);
      expect(stdout).toBe('first\nsecond\n');
      expect(stderr).toBe('warning\n');

      // an argv, no shell added: the ; reaches echo as text
      expect(sandgym(['exec', id, '--', 'echo', 'a;', 'b']).stdout).toBe('a; b\n');
      expect(sandgym(['exec', '--stdin', id, '--', 'wc', '-c'], 'twelve bytes').stdout.trim()).toBe('12');
      // another process packs what it wrote
      const packed = sandgym(['layer', 'build', '--from-sandbox', id, '--name', 'cliverbs-packed:1']);
      expect(packed.status, packed.stderr).toBe(0);
    } finally {
      await killAndWait(id);
    }
    expect(ps().map((record) => record.id)).not.toContain(id);
    expect(alive(ownerPid)).toBe(false);
    expect(existsSync(join(test.dataDir, 'holders', `${ownerPid}.json`))).toBe(false);
  });

  it('answers an unknown id with the code kill gives it, and bad usage with 2', () => {
    const exec = sandgym(['exec', 'sg-local-nosuchsandbox', '--', 'true']);
    const kill = sandgym(['kill', 'sg-local-nosuchsandbox']);
    expect(kill.status).toBe(2);
    expect(exec.status).toBe(kill.status);
    expect(exec.stderr).toMatch(/No sandbox "sg-local-nosuchsandbox"/);
    expect(sandgym(['exec', 'sg-local-nosuchsandbox']).status).toBe(2);
    expect(sandgym(['create', 'extra']).status).toBe(2);
  });

  it('serves a created sandbox to mcp --sandbox, and leaves it running after', async () => {
    const { id } = create('--env', 'busybox:latest');
    try {
      const client = new Client({ name: 'sandgym-test', version: '1.0.0' });
      await client.connect(
        new StdioClientTransport({
          command: 'node',
          args: [CLI, 'mcp', '--sandbox', id],
          env: env as Record<string, string>,
          stderr: 'pipe',
        }),
      );
      try {
        const result = (await client.callTool({
          name: 'exec',
          arguments: { command: 'echo hi; exit 4' },
        })) as {
          content: { text: string }[];
          isError?: boolean;
        };
        expect(result).toMatchObject({ isError: true, content: [{ text: 'hi\n[exit code 4]' }] });
      } finally {
        await client.close();
      }
      // the step ran in the created sandbox, and the sandbox is still there
      expect(sandgym(['exec', id, '--', 'true']).status).toBe(0);
      const audit = JSON.parse(sandgym(['audit', id, '--json']).stdout) as { steps: unknown[] };
      expect(audit.steps).toHaveLength(1);
    } finally {
      await killAndWait(id);
    }
  });

  it('refuses env rm while a sandbox uses the environment, naming it, and removes it after', async () => {
    const store = await LayerStore.open(join(test.dataDir, 'store'));
    const busybox = await store.getEnvironment('busybox:latest');
    await store.putEnvironment({ ...busybox, name: 'cliverbs', version: '1', description: 'a copy' });
    const { id } = create('--env', 'cliverbs:1');
    try {
      const refused = sandgym(['env', 'rm', 'cliverbs:1']);
      expect(refused.status).toBe(1);
      expect(refused.stderr).toContain(id);
      expect(store.hasEnvironment('cliverbs:1')).toBe(true);
    } finally {
      await killAndWait(id);
    }
    expect(sandgym(['env', 'rm', 'cliverbs:1']).status).toBe(0);
    expect(store.hasEnvironment('cliverbs:1')).toBe(false);
    const again = sandgym(['env', 'rm', 'cliverbs:1']);
    expect(again.status).toBe(2);
    expect(again.stderr).toMatch(/Unknown environment "cliverbs:1"/);
  });

  it('leaves an orphan that gc reaps when its holder is killed hard', async () => {
    const { id, ownerPid } = create('--env', 'busybox:latest');
    try {
      process.kill(ownerPid, 'SIGKILL');
      for (let i = 0; alive(ownerPid) && i < 100; i++) await sleep(100);
      expect(ps().find((record) => record.id === id)?.state).toBe('orphaned');
      const exec = sandgym(['exec', id, '--', 'true']);
      expect(exec.status).toBe(3);
      expect(exec.stderr).toMatch(/owner \(process \d+\) is gone: "sandgym gc" reaps it/);
      // the lookup removed the dead holder's record
      expect(existsSync(join(test.dataDir, 'holders', `${ownerPid}.json`))).toBe(false);
      expect(sandgym(['gc']).status).toBe(0);
      expect(ps().map((record) => record.id)).not.toContain(id);
    } finally {
      await killAndWait(id);
    }
  });

  it('reclaims a created sandbox left unused past its idle TTL, and its holder with it', async () => {
    const { id, ownerPid } = create('--env', 'busybox:latest', '--idle-ttl', '1s');
    try {
      for (let i = 0; ps().some((record) => record.id === id) && i < 300; i++) await sleep(100);
      expect(ps().map((record) => record.id)).not.toContain(id);
      for (let i = 0; alive(ownerPid) && i < 100; i++) await sleep(100);
      expect(alive(ownerPid)).toBe(false);
    } finally {
      await killAndWait(id);
    }
  });
});

describe('sandgym create and exec on a cluster', () => {
  const ALPHA = 'verbs-alpha-token-3c5e7a9b1d2f4680';
  const BETA = 'verbs-beta-token-8d6b4f2a0c1e3579';
  let nodeData: TestPlatform;
  let cluster: InProcessCluster;

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run "npm run build"`);
    nodeData = await createTestPlatform('cliverbs-node');
    cluster = await startInProcessCluster({
      dataDir: nodeData.dataDir,
      storeDir: STORE_DIR,
      nodeId: 'verbsnode',
      grants: {
        [ALPHA]: { project: 'alpha', maxSandboxes: 4, network: [] },
        [BETA]: { project: 'beta', maxSandboxes: 4, network: [] },
      },
    });
  });

  afterAll(async () => {
    // the node destroys what it still runs
    await cluster?.close();
    await nodeData?.[Symbol.asyncDispose]();
  });

  /** The CLI as a client of the cluster, run without blocking: the cluster answers from this process. */
  async function as(
    token: string,
    args: string[],
  ): Promise<{ status: number | null; stdout: string; stderr: string }> {
    const env = { ...process.env, SANDGYM_PLATFORM: cluster.url, SANDGYM_TOKEN: token };
    const child = spawn('node', [CLI, ...args], { env });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const status = await new Promise<number | null>((done) => child.once('close', (code) => done(code)));
    return { status, stdout, stderr };
  }

  it("makes through the controller a sandbox that outlives the command, which another project's id lookups never find", async () => {
    const made = await as(ALPHA, ['create', '--json', '--env', 'busybox:latest']);
    expect(made.status, made.stderr).toBe(0);
    const { id } = JSON.parse(made.stdout) as { id: string };
    try {
      const listed = JSON.parse((await as(ALPHA, ['ps', '--json'])).stdout) as {
        sandboxes: { id: string }[];
      };
      expect(listed.sandboxes.map((record) => record.id)).toContain(id);
      const run = await as(ALPHA, ['exec', id, '--', 'sh', '-c', 'echo out; exit 7']);
      expect(run).toMatchObject({ status: 7, stdout: 'out\n' });
      const kill = await as(BETA, ['kill', id]);
      expect(kill.status).toBe(2);
      const exec = await as(BETA, ['exec', id, '--', 'true']);
      expect(exec.status).toBe(kill.status);
      expect(exec.stderr).not.toMatch(/busybox/);
    } finally {
      expect((await as(ALPHA, ['kill', id])).status).toBe(0);
    }
    const left = JSON.parse((await as(ALPHA, ['ps', '--json'])).stdout) as { sandboxes: { id: string }[] };
    expect(left.sandboxes.map((record) => record.id)).not.toContain(id);
  });
});
