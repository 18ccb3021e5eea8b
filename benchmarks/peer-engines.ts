import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, readFile, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { runProgram } from '../src/backends/index.ts';
import { EngineApi } from './engine-api.ts';
import { waitUntil } from './loopback.ts';

/** A container engine the benchmark started for itself, in a folder of its own. */
export interface PeerEngine extends AsyncDisposable {
  api: EngineApi;
}

/**
 * Debian's dockerd, in `dir`, told to leave the host's network alone: no iptables rules, no
 * bridge, no forwarding, so sandgym's nftables tables and namespaces see nothing of it. Its
 * containers run with `--network none`.
 */
export async function startDocker(dir: string): Promise<PeerEngine> {
  const socket = join(dir, 'docker.sock');
  return startEngine('docker', dir, socket, '/usr/sbin/dockerd', [
    `--data-root=${join(dir, 'data')}`,
    `--exec-root=${join(dir, 'exec')}`,
    `--pidfile=${join(dir, 'docker.pid')}`,
    `--host=unix://${socket}`,
    '--iptables=false',
    '--ip6tables=false',
    '--bridge=none',
    '--ip-forward=false',
    '--ip-masq=false',
    '--userland-proxy=false',
    '--log-level=error',
  ]);
}

/** Debian's podman serving the Docker API from `dir`, rootful, with cgroupfs and no network. */
export async function startPodman(dir: string): Promise<PeerEngine> {
  const socket = join(dir, 'podman.sock');
  return startEngine('podman', dir, socket, '/usr/bin/podman', [
    `--root=${join(dir, 'root')}`,
    `--runroot=${join(dir, 'run')}`,
    `--tmpdir=${join(dir, 'tmp')}`,
    '--cgroup-manager=cgroupfs',
    // crun refuses this host's hybrid cgroups (a v2 mount beside v1 controllers); runc (docker.io's) takes them
    '--runtime=runc',
    '--events-backend=file',
    'system',
    'service',
    '--time=0',
    `unix://${socket}`,
  ]);
}

async function startEngine(
  name: string,
  dir: string,
  socket: string,
  program: string,
  args: string[],
): Promise<PeerEngine> {
  await mkdir(dir, { recursive: true });
  const daemon: ChildProcess = spawn(program, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let printed = '';
  daemon.stderr?.on('data', (chunk: Buffer) => (printed = `${printed}${chunk.toString()}`.slice(-2000)));
  // a daemon that cannot start fails the benchmark at once, with what it printed
  const died = new Promise<never>((_, reject) => {
    daemon.once('error', (error) => reject(new Error(`${program} did not start: ${error.message}`)));
    daemon.once('exit', (code) => reject(new Error(`${name} exited with ${code}: ${printed.trim()}`)));
  });
  died.catch(() => undefined);
  const api = new EngineApi(name, socket);
  const engine: PeerEngine = {
    api,
    async [Symbol.asyncDispose]() {
      for (const id of await api.containers().catch(() => [])) await api.remove(id).catch(() => undefined);
      if (daemon.exitCode === null && daemon.signalCode === null) {
        const exited = new Promise((done) => daemon.once('exit', done));
        daemon.kill('SIGTERM');
        const timer = setTimeout(() => daemon.kill('SIGKILL'), 15_000);
        await exited;
        clearTimeout(timer);
      }
      // podman's conmon lingers after an exec (its exit delay); nothing of the engine may outlive it
      await killUnder(dir);
      await unmountUnder(dir);
      await rm(dir, { recursive: true, force: true });
    },
  };
  try {
    await Promise.race([waitUntil(() => api.ping(), `${name} answering on ${socket}`, 60_000), died]);
  } catch (error) {
    await engine[Symbol.asyncDispose]();
    throw error;
  }
  return engine;
}

/** Kills every process whose command line names `dir` (shims, conmons, the daemon's helpers). */
async function killUnder(dir: string): Promise<void> {
  for (const pid of await readdir('/proc')) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    if (cmdline.includes(dir)) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // it ended meanwhile
      }
    }
  }
}

/** Unmounts whatever an engine left mounted below `dir`, deepest first. */
async function unmountUnder(dir: string): Promise<void> {
  const mounts = (await readFile('/proc/self/mountinfo', 'utf8'))
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => point === dir || point.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length);
  for (const point of mounts) await runProgram('umount', ['-l', point]).catch(() => undefined);
}
