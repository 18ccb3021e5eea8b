// A small cluster on one machine: node agents in network namespaces of their own, each with its
// own address on a veth pair, started with the real `sandgym node` command. The cluster example
// and the system test both build on it.
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import { packageRoot } from '../../src/backends/index.ts';

const run = promisify(execFile);
export const CLI = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');

/** A network namespace joined to the host by a veth pair: the host side is .1, the namespace .2. */
export interface HostInNamespace {
  netns: string;
  address: string;
  remove(): Promise<void>;
}

/** Makes a namespace with its own address on a /30 the host routes to. */
export async function createNamespace(tag: string, subnet: number): Promise<HostInNamespace> {
  const netns = `sgtest-${tag}`;
  const hostSide = `sg${tag}h`.slice(0, 15);
  const inside = `sg${tag}n`.slice(0, 15);
  const hostIp = `10.231.${subnet}.1`;
  const address = `10.231.${subnet}.2`;
  const remove = async (): Promise<void> => {
    // deleting the namespace destroys the veth end inside it, which takes its peer with it
    await run('ip', ['netns', 'delete', netns]).catch(() => undefined);
    await run('ip', ['link', 'delete', hostSide]).catch(() => undefined);
  };
  try {
    await run('ip', ['netns', 'add', netns]);
    await run('ip', ['link', 'add', hostSide, 'type', 'veth', 'peer', 'name', inside]);
    await run('ip', ['link', 'set', inside, 'netns', netns]);
    await run('ip', ['addr', 'add', `${hostIp}/30`, 'dev', hostSide]);
    await run('ip', ['link', 'set', hostSide, 'up']);
    for (const args of [
      ['addr', 'add', `${address}/30`, 'dev', inside],
      ['link', 'set', inside, 'up'],
      ['link', 'set', 'lo', 'up'],
    ]) {
      await run('ip', ['-n', netns, ...args]);
    }
  } catch (error) {
    await remove();
    throw error;
  }
  return { netns, address, remove };
}

/** A `sandgym node` process inside a namespace, as an operator would start it. */
export interface NodeProcess {
  nodeId: string;
  address: string;
  dataDir: string;
  child: ChildProcess;
  /** Starts it again on the same data dir and address (after a crash or stop), with `extraEnv` added. */
  restart(extraEnv?: Record<string, string>): Promise<void>;
  /** SIGTERM, and wait for it to exit. */
  stop(): Promise<void>;
}

function waitForStartLine(child: ChildProcess, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const timer = setTimeout(() => reject(new Error(`${what} did not start: ${stderr}`)), 60_000);
    lines.once('line', () => {
      clearTimeout(timer);
      resolve();
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited with ${code}: ${stderr}`));
    });
  });
}

/** Where a node keeps its data, which store it shares, and the token it accepts. */
export interface NodePlacement {
  dataDir: string;
  storeDir: string;
  token: string;
  /** More `sandgym node` flags (`--max-sandboxes 4`). */
  args?: string[];
  /** More environment variables for its first start only (a test's SANDGYM_FAULT_POINTS). */
  firstStartEnv?: Record<string, string>;
}

/** Starts `sandgym node` in a namespace (joining only its network, not a new mount namespace). */
export async function startNode(
  host: HostInNamespace,
  nodeId: string,
  port: number,
  { dataDir, storeDir, token, args = [], firstStartEnv = {} }: NodePlacement,
): Promise<NodeProcess> {
  const address = `${host.address}:${port}`;
  const launch = async (extraEnv: Record<string, string> = {}): Promise<ChildProcess> => {
    const child = spawn(
      'nsenter',
      [
        `--net=/var/run/netns/${host.netns}`,
        process.execPath,
        CLI,
        'node',
        '--listen',
        address,
        '--data-dir',
        dataDir,
        '--store',
        storeDir,
        '--node-id',
        nodeId,
        ...args,
      ],
      {
        env: { ...process.env, ...extraEnv, SANDGYM_NODE_TOKEN: token },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    await waitForStartLine(child, `node ${nodeId}`);
    return child;
  };
  const node: NodeProcess = {
    nodeId,
    address,
    dataDir,
    child: await launch(firstStartEnv),
    async restart(extraEnv?: Record<string, string>) {
      node.child = await launch(extraEnv);
    },
    async stop() {
      const child = node.child;
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await exited;
    },
  };
  return node;
}

/** Stops nodes, then removes their data dirs. */
export async function removeNode(node: NodeProcess): Promise<void> {
  try {
    await node.stop();
  } finally {
    await rm(node.dataDir, { recursive: true, force: true });
  }
}
