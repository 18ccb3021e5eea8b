import { timingSafeEqual } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { SandgymError, type Logger } from '../../common/index.ts';
import { bearerToken, checkTokenStrength, tokenDigest } from '../wire/index.ts';

/** An HTTP listener that serves one registry at `/metrics` in Prometheus's text format. */
export interface MetricsServer {
  readonly port: number;
  close(): Promise<void>;
}

/**
 * Serves `registry` on `listen`: `HOST:PORT`, or `PORT` for loopback's (port 0 picks one). Only
 * `GET /metrics` answers. Controllers' metrics name every project, so an address beyond loopback
 * needs a `token` each scrape must send (`authorization: Bearer <token>`); with a token, every
 * address asks for it.
 */
export async function serveMetrics(
  listen: string,
  registry: Registry,
  logger: Logger,
  token?: string,
): Promise<MetricsServer> {
  const match = /^(?:(.*):)?(\d{1,5})$/.exec(listen);
  if (!match)
    throw new SandgymError('invalid_argument', `--metrics-listen must be PORT or HOST:PORT, got "${listen}"`);
  const host = (match[1] || '127.0.0.1').replace(/^\[(.*)\]$/, '$1');
  if (token !== undefined) checkTokenStrength(token, 'The metrics token (--metrics-token-file)');
  else if (!isLoopback(host)) {
    throw new SandgymError(
      'invalid_argument',
      `Metrics on ${host} would be open beyond this host, and they name every project: give a scrape token (--metrics-token-file FILE; Prometheus sends it with authorization.credentials_file), or serve them on loopback (--metrics-listen ${match[2]})`,
    );
  }
  const expected = token === undefined ? undefined : tokenDigest(token);
  const server: Server = createServer((request, response) => {
    if (expected && !presents(request.headers.authorization, expected)) {
      response
        .writeHead(401, { 'content-type': 'text/plain', 'www-authenticate': 'Bearer' })
        .end('Send the metrics token: authorization: Bearer <token>\n');
      return;
    }
    if (request.method !== 'GET' || request.url?.split('?')[0] !== '/metrics') {
      response.writeHead(404, { 'content-type': 'text/plain' }).end('Only GET /metrics is served here\n');
      return;
    }
    registry.metrics().then(
      (text) => response.writeHead(200, { 'content-type': registry.contentType }).end(text),
      (error: unknown) => {
        logger.warn({ err: error }, 'collecting metrics failed');
        response.writeHead(500, { 'content-type': 'text/plain' }).end('collecting metrics failed\n');
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error) =>
      reject(new SandgymError('platform_error', `Cannot serve metrics on ${listen}: ${error.message}`)),
    );
    server.listen(Number(match[2]), host, resolve);
  });
  const port = (server.address() as AddressInfo).port;
  logger.info({ port }, 'metrics at /metrics');
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/** Whether only this host reaches `host`: a loopback address or name. */
function isLoopback(host: string): boolean {
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host) || host === '::1' || host === 'localhost';
}

/** Whether an authorization header carries the token whose digest is `expected`. */
function presents(header: string | undefined, expected: Buffer): boolean {
  const token = bearerToken(header);
  return token !== undefined && timingSafeEqual(tokenDigest(token), expected);
}
