import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { silentLogger, type Logger } from '../../src/common/index.ts';
import { Controller } from '../../src/platform/index.ts';
import { waitUntil } from '../../benchmarks/loopback.ts';
import {
  WireClient,
  WireServer,
  readTlsFiles,
  register,
  tokenAuthenticator,
  type TlsFiles,
} from '../../src/platform/wire/index.ts';
import { unary } from '../../src/platform/wire/service.ts';

const CLI = resolve('dist/src/cli/main.js');
const TOKEN = 'tls-causes-token-7c1d9e2f4a6b8035a1c3';

const PING = {
  name: 'test.v1.Ping',
  methods: { Ping: unary({ request: z.object({}), response: z.object({}), summary: 'ping' }) },
};

type CertSet = Record<'ca' | 'caKey' | 'server' | 'serverKey' | 'client' | 'clientKey', string>;

/**
 * Real certificates from `sandgym certs` and real servers on loopback: a client whose TLS does
 * not match the server's learns why at its first failed connection, not "not reachable" after
 * its whole wait. The wait is long, so a client that waits it out fails on the message.
 */
describe('a TLS mismatch', () => {
  const dir = mkdtempSync(join(tmpdir(), 'sandgym-tls-causes-'));
  const certs = (set: string): CertSet => {
    const run = spawnSync('node', [CLI, 'certs', '--out', join(dir, set), '--json'], { encoding: 'utf8' });
    expect(run.status, run.stderr).toBe(0);
    return JSON.parse(run.stdout) as CertSet;
  };
  let ours: CertSet;
  let theirs: CertSet;
  const servers: WireServer[] = [];
  const clients: WireClient<typeof PING>[] = [];
  const warnings: Error[] = [];
  const onWarning = (warning: Error): number => warnings.push(warning);

  beforeAll(() => {
    ours = certs('ours');
    theirs = certs('theirs');
    process.on('warning', onWarning);
  });
  afterEach(async () => {
    for (const client of clients.splice(0)) client.close();
    for (const server of servers.splice(0)) await server.close(0);
  });
  afterAll(() => {
    process.off('warning', onWarning);
    rmSync(dir, { recursive: true, force: true });
  });

  async function serve(tls?: TlsFiles): Promise<string> {
    const server = await WireServer.listen(
      '127.0.0.1:0',
      [register(PING, { Ping: () => Promise.resolve({}) })],
      {
        authenticate: tokenAuthenticator({ [TOKEN]: 'p' }),
        resolvers: {},
        logger: silentLogger(),
        ...(tls ? { tls } : {}),
      },
    );
    servers.push(server);
    return `127.0.0.1:${server.port}`;
  }

  const serverTls = () => readTlsFiles({ ca: ours.ca, cert: ours.server, key: ours.serverKey });

  function dial(address: string, tls?: TlsFiles): Promise<void> {
    const client = new WireClient(address, PING, { token: TOKEN, ...(tls ? { tls } : {}) });
    clients.push(client);
    return client.waitForReady(30_000);
  }

  it('from a plaintext client to a TLS server says the server speaks TLS', async () => {
    const address = await serve(await serverTls());
    await expect(dial(address)).rejects.toThrow(
      /speaks TLS and this client dials in plaintext.*SANDGYM_TLS_CA/,
    );
  });

  it('from a TLS client to a plaintext server says the server speaks plaintext', async () => {
    const address = await serve();
    await expect(
      dial(address, await readTlsFiles({ ca: ours.ca, cert: ours.client, key: ours.clientKey })),
    ).rejects.toThrow(/speaks plaintext and this client dials with TLS/);
  });

  it('without a client certificate says the server requires one', async () => {
    const address = await serve(await serverTls());
    await expect(dial(address, await readTlsFiles({ ca: ours.ca }))).rejects.toThrow(
      /requires a client certificate and this client has none.*SANDGYM_TLS_CERT/,
    );
  });

  it('with a client certificate of another CA says the server refused it', async () => {
    const address = await serve(await serverTls());
    await expect(
      dial(address, await readTlsFiles({ ca: ours.ca, cert: theirs.client, key: theirs.clientKey })),
    ).rejects.toThrow(/refused this client's certificate/);
  });

  it("trusting another CA says the server's certificate is not of that CA", async () => {
    const address = await serve(await serverTls());
    await expect(
      dial(address, await readTlsFiles({ ca: theirs.ca, cert: theirs.client, key: theirs.clientKey })),
    ).rejects.toThrow(/its certificate is not signed by the CA this client trusts/);
  });

  it('matched, connects to an IP address without a DEP0123 warning, and calls', async () => {
    const address = await serve(await serverTls());
    const tls = await readTlsFiles({ ca: ours.ca, cert: ours.client, key: ours.clientKey });
    await dial(address, tls);
    const client = new WireClient(address, PING, { token: TOKEN, tls });
    clients.push(client);
    await expect(client.call('Ping', {})).resolves.toEqual({});
    // warnings are emitted on the next tick
    await new Promise((done) => setImmediate(done));
    expect(warnings.map((warning) => `${warning.name}: ${warning.message}`)).toEqual([]);
  });

  it('between a controller and its node is logged by the controller, naming the cause', async () => {
    const node = await serve(await serverTls());
    const errors: string[] = [];
    const logger: Logger = {
      debug: () => undefined,
      info: () => undefined,
      warn: () => undefined,
      error: (fields, message) => errors.push(`${message ?? ''} ${JSON.stringify(fields)}`),
      child: () => logger,
    };
    // a controller without TLS, to a node with it
    const controller = await Controller.start({
      listen: '127.0.0.1:0',
      nodes: [node],
      nodeToken: TOKEN,
      grants: {},
      logger,
      pollMs: 100,
    });
    try {
      await waitUntil(() => Promise.resolve(errors.length > 0), 'the controller logging the mismatch');
      expect(errors).toEqual([
        expect.stringMatching(/refuses this controller.*speaks TLS and this client dials in plaintext/),
      ]);
    } finally {
      await controller.close();
    }
  });
});
