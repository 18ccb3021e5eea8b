import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { packageRoot } from '../src/backends/index.ts';
import { defaultDataDir, defaultStoreDir } from '../src/platform/index.ts';

/** A `sandgym node` in its own process on loopback, as a benchmark's remote end. */
export interface BenchNode extends AsyncDisposable {
  url: string;
  token: string;
}

/** `args` are more `sandgym node` options (`--max-sandboxes 1100`, say). */
export async function startBenchNode(args: readonly string[] = []): Promise<BenchNode> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-node-${process.pid}`);
  const token = randomBytes(32).toString('hex');
  const child: ChildProcess = spawn(
    process.execPath,
    [
      join(packageRoot(), 'dist', 'src', 'cli', 'main.js'),
      'node',
      '--listen',
      '127.0.0.1:0',
      '--data-dir',
      dataDir,
      '--store',
      defaultStoreDir(base),
      '--node-id',
      'bench',
      ...args,
    ],
    { env: { ...process.env, SANDGYM_NODE_TOKEN: token }, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const port = await new Promise<number>((resolvePort, reject) => {
    createInterface({ input: child.stdout! }).once('line', (line) =>
      resolvePort((JSON.parse(line) as { port: number }).port),
    );
    child.once('exit', (code) => reject(new Error(`sandgym node exited with ${code}`)));
  });
  return {
    url: `grpc://127.0.0.1:${port}`,
    token,
    async [Symbol.asyncDispose]() {
      const exited = new Promise((done) => child.once('exit', done));
      child.kill('SIGTERM');
      await exited;
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}
