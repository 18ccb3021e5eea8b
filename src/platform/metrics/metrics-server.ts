import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { SandgymError, type Logger } from '../../common/index.ts';

/** An HTTP listener that serves one registry at `/metrics` in Prometheus's text format. */
export interface MetricsServer {
  readonly port: number;
  close(): Promise<void>;
}

/** Serves `registry` on `listen` (host:port; port 0 picks one). Only `GET /metrics` answers. */
export async function serveMetrics(
  listen: string,
  registry: Registry,
  logger: Logger,
): Promise<MetricsServer> {
  const match = /^(.+):(\d{1,5})$/.exec(listen);
  if (!match)
    throw new SandgymError('invalid_argument', `--metrics-listen must be HOST:PORT, got "${listen}"`);
  const host = match[1]!.replace(/^\[(.*)\]$/, '$1');
  const server: Server = createServer((request, response) => {
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
