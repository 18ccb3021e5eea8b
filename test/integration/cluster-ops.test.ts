import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { nodeOfSandboxId, silentLogger } from '../../src/common/index.ts';
import type { NodeAgent } from '../../src/platform/index.ts';
import {
  Controller,
  Platform,
  readTlsFiles,
  type ControllerOptions,
  type NodeAgentOptions,
  type PlatformClient,
  type TlsFiles,
} from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import { NODE, WireClient } from '../../src/platform/wire/index.ts';
import { startTestNode } from '../support/in-process-cluster.ts';
import { TEST_DATA_ROOT } from '../support/platform.ts';
import { waitUntil } from '../../benchmarks/loopback.ts';
import { startPrometheus } from '../support/prometheus.ts';
import { PYTHON } from '../../benchmarks/python-client.ts';

const CLI = resolve('dist/src/cli/main.js');
const NODE_TOKEN = 'cluster-ops-node-token-5d2b8e1f7a3c9046';
const SMALL = { environment: 'busybox:latest', resources: { memoryMib: 32 } };
const GRANTS = {
  'token-a': { project: 'a', maxSandboxes: 20 },
  'token-tiny': { project: 'tiny', maxSandboxes: 1 },
};

describe('cluster operations', () => {
  const cleanup: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    for (const step of cleanup.reverse()) await step().catch((error: unknown) => console.error(error));
    cleanup.length = 0;
  });

  function node(name: string, options: Partial<NodeAgentOptions> = {}): Promise<NodeAgent> {
    return startTestNode(cleanup, name, { token: NODE_TOKEN, ...options });
  }

  async function controller(
    nodes: NodeAgent[],
    options: Partial<ControllerOptions> = {},
  ): Promise<Controller> {
    const started = await Controller.start({
      listen: '127.0.0.1:0',
      nodes: nodes.map((n) => `127.0.0.1:${n.port}`),
      nodeToken: NODE_TOKEN,
      grants: GRANTS,
      logger: silentLogger(),
      pollMs: 100,
      ...options,
    });
    cleanup.push(() => started.close());
    return started;
  }

  async function connect(replica: Controller, token: string, tls?: TlsFiles): Promise<PlatformClient> {
    const client = await Platform.connect(`grpc://127.0.0.1:${replica.port}`, {
      token,
      connectTimeoutMs: 3_000,
      ...(tls ? { tls } : {}),
    });
    cleanup.push(() => client.close());
    return client;
  }

  describe('mutual TLS on every hop', () => {
    const dir = join(TEST_DATA_ROOT, `certs-${process.pid}`);
    const certs = (set: string) => {
      const run = spawnSync('node', [CLI, 'certs', '--out', join(dir, set), '--json'], { encoding: 'utf8' });
      expect(run.status, run.stderr).toBe(0);
      return JSON.parse(run.stdout) as Record<
        'ca' | 'caKey' | 'server' | 'serverKey' | 'client' | 'clientKey',
        string
      >;
    };
    let ours: ReturnType<typeof certs>;
    let theirs: ReturnType<typeof certs>;

    beforeAll(() => {
      ours = certs('ours');
      theirs = certs('theirs');
    });
    afterAll(() => spawnSync('rm', ['-rf', dir]));

    it('makes a development CA once and signs new certificates with it', () => {
      const ca = readFileSync(ours.ca, 'utf8');
      const server = readFileSync(ours.server, 'utf8');
      const again = certs('ours');
      expect(readFileSync(again.ca, 'utf8')).toBe(ca);
      expect(readFileSync(again.server, 'utf8')).not.toBe(server);
      for (const leaf of [again.server, again.client]) {
        const verify = spawnSync('openssl', ['verify', '-CAfile', ours.ca, leaf], { encoding: 'utf8' });
        expect(verify.stdout).toContain(': OK');
      }
      const san = spawnSync('openssl', ['x509', '-in', again.server, '-noout', '-ext', 'subjectAltName'], {
        encoding: 'utf8',
      });
      expect(san.stdout).toMatch(/DNS:localhost, IP Address:127\.0\.0\.1/);
      expect(spawnSync('stat', ['-c', '%a', again.clientKey], { encoding: 'utf8' }).stdout.trim()).toBe(
        '600',
      );
    });

    it('serves clients that show a certificate of its CA, and refuses plaintext and other CAs', async () => {
      const serverTls = await readTlsFiles({ ca: ours.ca, cert: ours.server, key: ours.serverKey });
      const tlsNode = await node('tls', { tls: serverTls });
      const replica = await controller([tlsNode], { tls: serverTls });

      // the whole path, client -> controller -> node, over mutual TLS
      const client = await connect(
        replica,
        'token-a',
        await readTlsFiles({ ca: ours.ca, cert: ours.client, key: ours.clientKey }),
      );
      const sandbox = await client.createSandbox(SMALL);
      expect((await sandbox.exec(['echo', 'over tls'])).stdout).toBe('over tls\n');

      // plaintext, TLS without a client certificate, and a certificate of another CA: all refused
      await expect(connect(replica, 'token-a')).rejects.toThrow(
        /speaks TLS and this client dials in plaintext/,
      );
      await expect(connect(replica, 'token-a', await readTlsFiles({ ca: ours.ca }))).rejects.toThrow(
        /requires a client certificate/,
      );
      await expect(
        connect(
          replica,
          'token-a',
          await readTlsFiles({ ca: theirs.ca, cert: theirs.client, key: theirs.clientKey }),
        ),
      ).rejects.toThrow(/not signed by the CA this client trusts/);
      await expect(
        connect(
          replica,
          'token-a',
          await readTlsFiles({ ca: ours.ca, cert: theirs.client, key: theirs.clientKey }),
        ),
      ).rejects.toThrow(/refused this client's certificate/);

      // the Python client, with the same files from the environment, and refused without them
      const script = [
        'import sys, sandgym',
        'platform = sandgym.Platform.connect(sys.argv[1], "token-a", connect_timeout=3)',
        'with platform.create_sandbox({"environment": "busybox:latest", "resources": {"memoryMib": 32}}) as box:',
        '    print(box.exec(["echo", "python over tls"]).stdout, end="")',
      ].join('\n');
      const python = async (tls: Record<string, string>) => {
        const child = spawn(PYTHON, ['-c', script, `grpc://127.0.0.1:${replica.port}`], {
          env: { ...process.env, PYTHONPATH: resolve('python'), ...tls },
        });
        let out = '';
        child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
        child.stderr.on('data', (chunk: Buffer) => (out += chunk.toString()));
        const status = await new Promise<number | null>((done) => child.on('exit', done));
        return { status, out };
      };
      const withTls = await python({
        SANDGYM_TLS_CA: ours.ca,
        SANDGYM_TLS_CERT: ours.client,
        SANDGYM_TLS_KEY: ours.clientKey,
      });
      expect(withTls, withTls.out).toEqual({ status: 0, out: 'python over tls\n' });
      const plaintext = await python({});
      expect(plaintext.status).not.toBe(0);
      expect(plaintext.out).toMatch(/node_lost|did not answer/);

      // the node refuses a plaintext caller even with the node token
      await expect(
        Platform.connect(`grpc://127.0.0.1:${tlsNode.port}`, { token: NODE_TOKEN, connectTimeoutMs: 2_000 }),
      ).rejects.toThrow(/speaks TLS and this client dials in plaintext/);
      // and a controller that speaks plaintext to it cannot place there
      const plain = await controller([tlsNode], { queueTimeoutMs: 1_000 });
      await expectCode(
        (await connect(plain, 'token-a')).createSandbox(SMALL),
        'admission_rejected',
        /No node/,
      );
    });
  });

  it('exports metrics that a real Prometheus scrapes from the node and the controller', async () => {
    const agent = await node('metrics', { maxSandboxes: 3, metricsListen: '127.0.0.1:0' });
    const replica = await controller([agent], { metricsListen: '127.0.0.1:0', queueTimeoutMs: 60_000 });
    const prometheus = await startPrometheus(join(TEST_DATA_ROOT, `prometheus-${process.pid}`), [
      `127.0.0.1:${agent.metricsPort}`,
      `127.0.0.1:${replica.metricsPort}`,
    ]);
    cleanup.push(async () => prometheus[Symbol.asyncDispose]());
    // a project over its quota is refused
    const tiny = await connect(replica, 'token-tiny');
    const only = await tiny.createSandbox(SMALL);
    await expectCode(tiny.createSandbox(SMALL), 'resource_exhausted', /quota/);
    await only.close();
    const client = await connect(replica, 'token-a');
    const made = [];
    for (let i = 0; i < 3; i++) made.push(await client.createSandbox(SMALL));
    await made[0]!.exec(['sh', '-c', 'head -c 8000000 /dev/zero > /dev/shm/fill; sleep 2']);
    await client.step(made[0]!, {
      episodeId: 'e1',
      stepIndex: 0,
      action: { type: 'exec', command: ['true'] },
    });
    // the node is full: a fourth create waits in the controller's queue
    const waiting = client.createSandbox(SMALL);

    const value = async (promql: string): Promise<number> =>
      (await prometheus.query(promql)).reduce((sum, sample) => sum + sample.value, 0);
    const eventually = (promql: string, ok: (v: number) => boolean) =>
      waitUntil(async () => ok(await value(promql)), `Prometheus seeing ${promql}`, 30_000);

    await eventually('sandgym_controller_queue_depth{project="a"}', (v) => v === 1);
    await eventually('sandgym_node_create_seconds_count{backend="container"}', (v) => v === 4);
    await eventually('sandgym_node_sandboxes{state="running",backend="container"}', (v) => v === 3);
    await eventually('sandgym_node_step_seconds_count{outcome="ok"}', (v) => v === 1);
    await eventually('sandgym_node_memory_committed_bytes', (v) => v === 3 * 32 * 1024 * 1024);
    await eventually('sandgym_node_memory_measured_bytes', (v) => v > 0 && v < 3 * 32 * 1024 * 1024);
    await eventually('sandgym_controller_admissions_total{result="admitted"}', (v) => v === 4);
    await eventually('sandgym_controller_admissions_total{result="refused",reason="quota"}', (v) => v === 1);
    await eventually('sandgym_node_creates_total{outcome="created",backend="container"}', (v) => v === 4);
    await eventually('sandgym_controller_nodes{state="healthy"}', (v) => v === 1);

    await made[1]!.close();
    expect(nodeOfSandboxId((await waiting).id)).toBe('metrics');
    await eventually('sandgym_controller_queue_depth{project="a"}', (v) => v === 0);
    await eventually(
      'histogram_quantile(0.5, sum by (le) (sandgym_controller_create_seconds_bucket{outcome="created"}))',
      (v) => v > 0,
    );
  });

  it('refuses cluster command lines that cannot work, naming what to change', () => {
    const sandgym = (...args: string[]) =>
      spawnSync('node', [CLI, ...args], {
        env: { ...process.env, SANDGYM_NODE_TOKEN: NODE_TOKEN },
        encoding: 'utf8',
      });
    const both = sandgym(
      'controller',
      '--listen',
      '127.0.0.1:0',
      '--nodes',
      '127.0.0.1:1',
      '--etcd',
      'http://127.0.0.1:2',
      '--grants',
      'g.json',
    );
    expect(both.status).toBe(2);
    expect(both.stderr).toMatch(/either --nodes .* or --etcd/);
    const halfTls = sandgym(
      'controller',
      '--listen',
      '127.0.0.1:0',
      '--nodes',
      '127.0.0.1:1',
      '--grants',
      'g.json',
      '--tls-ca',
      'ca.pem',
    );
    expect(halfTls.status).toBe(2);
    expect(halfTls.stderr).toMatch(/--tls-ca, --tls-cert and --tls-key together/);
    const wildcard = sandgym('node', '--listen', '0.0.0.0:0', '--etcd', 'http://127.0.0.1:2');
    expect(wildcard.status).toBe(2);
    expect(wildcard.stderr).toMatch(/give --advertise HOST:PORT/);
    const badEtcd = sandgym('node', '--listen', '127.0.0.1:0', '--etcd', '127.0.0.1:2379');
    expect(badEtcd.status).toBe(2);
    expect(badEtcd.stderr).toMatch(/etcd endpoints must be URLs like http:\/\/10\.0\.0\.5:2379/);
  });

  it('refuses a create at once, naming the drain, while every node that could hold it drains', async () => {
    const only = await node('drainall');
    const replica = await controller([only], { queueTimeoutMs: 60_000 });
    const client = await connect(replica, 'token-a');
    const operator = new WireClient(`127.0.0.1:${only.port}`, NODE, { token: NODE_TOKEN });
    cleanup.push(() => Promise.resolve(operator.close()));
    for await (const progress of operator.stream('Drain', { hibernateIdle: false })) void progress;
    // placed before the controller saw the drain, it is refused by the node and waits for a poll;
    // after it, it is refused at once: either way it ends in the drain's error, not the queue's
    await expectCode(client.createSandbox(SMALL), 'admission_rejected', /draining \(drainall\).*undrain/);
    await operator.call('Undrain', {});
    await waitUntil(async () => {
      const made = await client.createSandbox(SMALL).catch(() => undefined);
      await made?.close();
      return made !== undefined;
    }, 'a create after the undrain');
  });

  it('drains a node: no new placements, and done once its sandboxes ended or hibernated', async () => {
    const first = await node('draina');
    const second = await node('drainb');
    const replica = await controller([first, second]);
    const client = await connect(replica, 'token-a');
    const onFirst = [];
    while (onFirst.length < 2) {
      const sandbox = await client.createSandbox(SMALL);
      if (nodeOfSandboxId(sandbox.id) === 'draina') onFirst.push(sandbox);
    }
    const drain = spawn('node', [CLI, 'node', 'drain', '--node', `127.0.0.1:${first.port}`], {
      env: { ...process.env, SANDGYM_NODE_TOKEN: NODE_TOKEN },
    });
    let stderr = '';
    drain.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((done) => drain.on('exit', done));
    cleanup.push(() => Promise.resolve(drain.kill()));
    await waitUntil(
      () => Promise.resolve(/2 still running/.test(stderr)),
      'the drain reporting what it waits for',
    );
    await waitUntil(() => Promise.resolve(first.status().draining), 'the node draining');
    await new Promise((r) => setTimeout(r, 300)); // a poll, so the controller has seen it
    for (let i = 0; i < 6; i++)
      expect(nodeOfSandboxId((await client.createSandbox(SMALL)).id)).toBe('drainb');

    await onFirst[0]!.close();
    await onFirst[1]!.hibernate();
    expect(await exited).toBe(0);
    expect(stderr).toMatch(/is drained; 1 sandboxes hibernated/);
    // undrained, it takes sandboxes again
    // (spawned, not spawnSync: the node answers from this process)
    const undrain = spawn('node', [CLI, 'node', 'undrain', '--node', `127.0.0.1:${first.port}`], {
      env: { ...process.env, SANDGYM_NODE_TOKEN: NODE_TOKEN },
      stdio: 'ignore',
    });
    expect(await new Promise((done) => undrain.on('exit', done))).toBe(0);
    expect(first.status().draining).toBe(false);
  });
});
