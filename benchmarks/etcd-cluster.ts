import { spawn, type ChildProcess } from 'node:child_process';
import { get as httpsGet } from 'node:https';
import { mkdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { freePort, waitUntil } from './loopback.ts';

/** One member of an etcd cluster on loopback (tests and benchmarks start them). */
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

/** PEM files for an etcd that serves clients over TLS and requires their certificates. */
export interface EtcdTlsFiles {
  ca: string;
  cert: string;
  key: string;
}

/**
 * Starts `size` etcd members on loopback ports as one cluster and waits until it has a leader.
 * With `tls`, clients must speak https and show a certificate the CA signed.
 */
export async function startEtcdCluster(dir: string, size = 3, tls?: EtcdTlsFiles): Promise<EtcdCluster> {
  const scheme = tls ? 'https' : 'http';
  const tlsArgs = tls
    ? [
        `--cert-file=${tls.cert}`,
        `--key-file=${tls.key}`,
        `--trusted-ca-file=${tls.ca}`,
        '--client-cert-auth',
      ]
    : [];
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
        `--listen-client-urls=${scheme}://127.0.0.1:${client}`,
        `--advertise-client-urls=${scheme}://127.0.0.1:${client}`,
        ...tlsArgs,
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
      endpoint: `${scheme}://127.0.0.1:${client}`,
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
          return (await etcdHealth(member.endpoint, tls)) === 'true';
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

/** A member's /health answer; over https with a client certificate when it wants one. */
async function etcdHealth(endpoint: string, tls: EtcdTlsFiles | undefined): Promise<string | undefined> {
  if (!tls) {
    const body = (await (await fetch(`${endpoint}/health`)).json()) as { health?: string };
    return body.health;
  }
  const [ca, cert, key] = await Promise.all([readFile(tls.ca), readFile(tls.cert), readFile(tls.key)]);
  const text = await new Promise<string>((resolve, reject) => {
    const request = httpsGet(`${endpoint}/health`, { ca, cert, key }, (response) => {
      let body = '';
      response.on('data', (chunk: Buffer) => (body += chunk.toString()));
      response.on('end', () => resolve(body));
    });
    request.on('error', reject);
  });
  return (JSON.parse(text) as { health?: string }).health;
}

function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGKILL');
  });
}
