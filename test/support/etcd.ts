import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { freePort, waitUntil } from './ports.ts';

/** One member of a test etcd cluster. */
export interface EtcdMember {
  name: string;
  /** Its client URL, http://127.0.0.1:PORT. */
  endpoint: string;
  /** Kills it (SIGKILL): the others keep quorum, and clients bound to it alone lose etcd. */
  kill(): Promise<void>;
}

/** Debian's etcd, several members on loopback, data under `dir`. */
export interface EtcdCluster extends AsyncDisposable {
  members: EtcdMember[];
  endpoints: string[];
}

/** Starts `size` etcd members on loopback ports as one cluster and waits until it has a leader. */
export async function startEtcdCluster(dir: string, size = 3): Promise<EtcdCluster> {
  await mkdir(dir, { recursive: true });
  const ports: { client: number; peer: number }[] = [];
  for (let i = 0; i < size; i++) ports.push({ client: await freePort(), peer: await freePort() });
  const names = ports.map((_, i) => `m${i + 1}`);
  const initialCluster = names.map((name, i) => `${name}=http://127.0.0.1:${ports[i]!.peer}`).join(',');
  const children: ChildProcess[] = [];
  const members: EtcdMember[] = names.map((name, i) => {
    const { client, peer } = ports[i]!;
    const child = spawn(
      'etcd',
      [
        `--name=${name}`,
        `--data-dir=${join(dir, name)}`,
        `--listen-client-urls=http://127.0.0.1:${client}`,
        `--advertise-client-urls=http://127.0.0.1:${client}`,
        `--listen-peer-urls=http://127.0.0.1:${peer}`,
        `--initial-advertise-peer-urls=http://127.0.0.1:${peer}`,
        `--initial-cluster=${initialCluster}`,
        '--initial-cluster-state=new',
        `--initial-cluster-token=sandgym-test-${ports[0]!.client}`,
        '--log-level=error',
        '--logger=zap',
      ],
      { stdio: 'ignore' },
    );
    children.push(child);
    return {
      name,
      endpoint: `http://127.0.0.1:${client}`,
      kill: () => stop(child),
    };
  });
  const cluster: EtcdCluster = {
    members,
    endpoints: members.map((member) => member.endpoint),
    async [Symbol.asyncDispose]() {
      await Promise.all(children.map(stop));
      await rm(dir, { recursive: true, force: true });
    },
  };
  try {
    for (const member of members) {
      await waitUntil(
        async () => {
          const health = await fetch(`${member.endpoint}/health`).then(
            (r) => r.json() as Promise<{ health?: string }>,
          );
          return health.health === 'true';
        },
        `etcd member ${member.name} becoming healthy`,
        30_000,
      );
    }
  } catch (error) {
    await cluster[Symbol.asyncDispose]();
    throw error;
  }
  return cluster;
}

function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGKILL');
  });
}
