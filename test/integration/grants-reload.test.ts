import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { Platform, type PlatformClient } from '../../src/platform/index.ts';
import { waitUntil } from '../../benchmarks/loopback.ts';

const CLI = resolve('dist/src/cli/main.js');
const NODE_TOKEN = 'grants-reload-node-token-4e8a1c7b93d2f605';
const OLD_TOKEN = 'grants-reload-old-token-0123456789';
const NEW_TOKEN = 'grants-reload-new-token-9876543210';

/**
 * A real `sandgym controller` process and real `kill -HUP`: the grants file is read again, a
 * new token works at once, and a file with a mistake keeps the grants in force and says what
 * is wrong, by file and field.
 */
describe('a controller given SIGHUP', () => {
  const dir = mkdtempSync(join(tmpdir(), 'sandgym-grants-reload-'));
  const file = join(dir, 'grants.json');
  let controller: ChildProcess | undefined;
  let clients: PlatformClient[] = [];
  afterEach(async () => {
    for (const client of clients) await client.close();
    clients = [];
    controller?.kill('SIGKILL');
    controller = undefined;
    rmSync(dir, { recursive: true, force: true });
  });

  const grant = (token: string, maxSandboxes: number) =>
    JSON.stringify({ tokens: { [token]: { project: 'p', maxSandboxes } } });

  /** Lists sandboxes with `token`: what the controller says to it ('ok' or the error code). */
  async function answerTo(port: number, token: string): Promise<string> {
    const client = await Platform.connect(`grpc://127.0.0.1:${port}`, { token, connectTimeoutMs: 10_000 });
    clients.push(client);
    return client.listSandboxes().then(
      () => 'ok',
      (error: { code?: string }) => error.code ?? 'unknown',
    );
  }

  it('reloads its grants, and keeps them when the file is wrong', async () => {
    writeFileSync(file, grant(OLD_TOKEN, 5));
    // a node address nothing listens on: the controller serves its clients all the same
    const started = spawn(
      'node',
      [CLI, 'controller', '--listen', '127.0.0.1:0', '--nodes', '127.0.0.1:9', '--grants', file],
      { env: { ...process.env, SANDGYM_NODE_TOKEN: NODE_TOKEN }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    controller = started;
    let stdout = '';
    let stderr = '';
    started.stdout.on('data', (chunk: Buffer) => (stdout += String(chunk)));
    started.stderr.on('data', (chunk: Buffer) => (stderr += String(chunk)));
    await waitUntil(() => Promise.resolve(stdout.includes('"port"')), 'the controller listening');
    const { port } = JSON.parse(stdout.split('\n')[0] ?? '') as { port: number };

    expect(await answerTo(port, OLD_TOKEN)).toBe('ok');
    expect(await answerTo(port, NEW_TOKEN)).toBe('unauthenticated');

    writeFileSync(file, grant(NEW_TOKEN, 5));
    started.kill('SIGHUP');
    await waitUntil(() => Promise.resolve(/grants reloaded/.test(stderr)), 'the reload logged', 10_000);
    expect(await answerTo(port, NEW_TOKEN)).toBe('ok');
    expect(await answerTo(port, OLD_TOKEN)).toBe('unauthenticated');

    // a mistake: the new grants stay, and the log names the file and the field
    writeFileSync(file, grant(OLD_TOKEN, -1));
    started.kill('SIGHUP');
    await waitUntil(() => Promise.resolve(/grants not reloaded/.test(stderr)), 'the refusal logged', 10_000);
    const refusal = stderr.split('\n').find((line) => line.includes('grants not reloaded')) ?? '';
    expect(refusal).toContain(file);
    expect(refusal).toMatch(/token #1 \(project p\).*maxSandboxes/);
    expect(refusal).not.toContain(OLD_TOKEN);
    expect(await answerTo(port, NEW_TOKEN)).toBe('ok');
    expect(await answerTo(port, OLD_TOKEN)).toBe('unauthenticated');
    expect(started.exitCode).toBeNull();
  });
});
