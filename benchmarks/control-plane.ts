import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { silentLogger } from '../src/common/index.ts';
import { packageRoot, runProgram } from '../src/backends/index.ts';
import {
  Controller,
  NodeAgent,
  Platform,
  defaultDataDir,
  defaultStoreDir,
  readTlsFiles,
  type ControllerOptions,
  type NodeAgentOptions,
  type PlatformClient,
  type TlsFiles,
} from '../src/platform/index.ts';
import { startEtcdCluster } from './etcd-cluster.ts';
import { Stack } from './stack.ts';
import { compared, hostInfo, quantile, type BenchOptions, type BenchReport } from './report.ts';

const ROUNDS = 60;
const WARMUP = 5;
const EXECS = 200;
const SMALL = { environment: 'busybox:latest', resources: { memoryMib: 32 } };

/**
 * control-plane: what etcd and mutual TLS cost on the paths a trainer uses, through a controller
 * in one process with its node: create→ready with a fixed `--nodes` list against the same with
 * membership and an exact quota transaction in etcd (a one-member etcd on loopback), and create
 * and exec round trips over mutual TLS against plaintext. Rounds alternate the sides.
 */
export async function benchControlPlane(options: BenchOptions): Promise<BenchReport> {
  const dir = resolve(defaultDataDir(), `bench-control-plane-${process.pid}`);
  const stack = new Stack();
  stack.add(() => rm(dir, { recursive: true, force: true }));
  try {
    options.progress('control-plane: a development CA and a one-member etcd on loopback');
    const certs = JSON.parse(
      await runProgram(process.execPath, [
        join(packageRoot(), 'dist', 'src', 'cli', 'main.js'),
        'certs',
        '--out',
        join(dir, 'certs'),
      ]),
    ) as Record<'ca' | 'server' | 'serverKey' | 'client' | 'clientKey', string>;
    const serverTls = await readTlsFiles({ ca: certs.ca, cert: certs.server, key: certs.serverKey });
    const clientTls = await readTlsFiles({ ca: certs.ca, cert: certs.client, key: certs.clientKey });
    const etcd = await startEtcdCluster(join(dir, 'etcd'), 1);
    stack.add(async () => etcd[Symbol.asyncDispose]());

    const nodeToken = randomBytes(32).toString('hex');
    const grants = { [randomBytes(16).toString('hex')]: { project: 'bench', maxSandboxes: 1000 } };
    const clientToken = Object.keys(grants)[0]!;
    const node = async (name: string, extra: Partial<NodeAgentOptions>): Promise<string> => {
      const platform = await Platform.local({
        dataDir: join(dir, name),
        storeDir: defaultStoreDir(defaultDataDir()),
        nodeId: name,
      });
      const agent = await NodeAgent.start(platform, {
        listen: '127.0.0.1:0',
        token: nodeToken,
        logger: silentLogger(),
        ...extra,
      }).catch(async (error: unknown) => {
        await platform.close();
        throw error;
      });
      stack.add(() => agent.close());
      return `127.0.0.1:${agent.port}`;
    };
    const controller = async (extra: Partial<ControllerOptions>, tls?: TlsFiles): Promise<PlatformClient> => {
      const started = await Controller.start({
        listen: '127.0.0.1:0',
        nodeToken,
        grants,
        logger: silentLogger(),
        ...extra,
      });
      stack.add(() => started.close());
      const client = await Platform.connect(`grpc://127.0.0.1:${started.port}`, {
        token: clientToken,
        ...(tls ? { tls } : {}),
      });
      stack.add(() => client.close());
      return client;
    };
    const inEtcd = await node('benchetcd', { etcd: { endpoints: etcd.endpoints } });
    const withTls = await node('benchtls', { tls: serverTls });
    const sides = {
      static: await controller({ nodes: [inEtcd] }),
      etcd: await controller({ etcd: { endpoints: etcd.endpoints } }),
      tls: await controller({ nodes: [withTls], tls: serverTls }, clientTls),
    };

    options.progress(`control-plane: ${ROUNDS} creates on each side, alternating`);
    const creates: Record<keyof typeof sides, number[]> = { static: [], etcd: [], tls: [] };
    for (let round = 0; round < ROUNDS + WARMUP; round++) {
      for (const [name, client] of Object.entries(sides) as [keyof typeof sides, PlatformClient][]) {
        const started = performance.now();
        const sandbox = await client.createSandbox(SMALL);
        const elapsed = performance.now() - started;
        await sandbox.close();
        if (round >= WARMUP) creates[name].push(elapsed);
      }
    }

    options.progress(`control-plane: ${EXECS} exec round trips over plaintext and mutual TLS`);
    const plainBox = await sides.static.createSandbox(SMALL);
    const tlsBox = await sides.tls.createSandbox(SMALL);
    const execs = { plain: [] as number[], tls: [] as number[] };
    for (let i = 0; i < EXECS + WARMUP; i++) {
      for (const [name, box] of [
        ['plain', plainBox],
        ['tls', tlsBox],
      ] as const) {
        const started = performance.now();
        await box.exec(['true']);
        if (i >= WARMUP) execs[name].push(performance.now() - started);
      }
    }
    await plainBox.close();
    await tlsBox.close();

    const p50 = (samples: number[]): number => quantile(samples, 0.5);
    return {
      bench: 'control-plane',
      host: hostInfo(),
      metrics: {
        create_p50_etcd_vs_static: compared(p50(creates.etcd), p50(creates.static)),
        create_p99_etcd_vs_static: compared(quantile(creates.etcd, 0.99), quantile(creates.static, 0.99)),
        create_p50_mtls_vs_plaintext: compared(p50(creates.tls), p50(creates.static)),
        exec_p50_mtls_vs_plaintext: compared(p50(execs.tls), p50(execs.plain)),
        exec_p99_mtls_vs_plaintext: compared(quantile(execs.tls, 0.99), quantile(execs.plain, 0.99)),
      },
    };
  } finally {
    await stack.close();
  }
}
