import { readFile } from 'node:fs/promises';
import { checkEtcdEndpoints, readTlsFiles, type EtcdOptions, type TlsFiles } from '../../platform/index.ts';
import { text, type ParsedCommandArgs } from '../args.ts';
import type { OptionTable } from '../command-spec.ts';
import { UsageError } from '../exit-codes.ts';

/** Options every cluster server shares: TLS files, etcd, and where metrics are served. */
export const CLUSTER_SERVER_OPTIONS = {
  'tls-ca': {
    type: 'string',
    value: 'FILE',
    description: 'mutual TLS: the CA (with --tls-cert and --tls-key)',
  },
  'tls-cert': { type: 'string', value: 'FILE', description: "mutual TLS: this server's certificate" },
  'tls-key': { type: 'string', value: 'FILE', description: "mutual TLS: this server's key" },
  etcd: { type: 'string', value: 'URL,...', description: 'etcd endpoints to join through' },
  'metrics-listen': {
    type: 'string',
    value: '[HOST:]PORT',
    description: 'serve Prometheus metrics there (loopback unless HOST; off it, a token)',
  },
  'metrics-token-file': {
    type: 'string',
    value: 'FILE',
    description: 'the token a metrics scrape must send',
  },
  'node-token-file': {
    type: 'string',
    value: 'FILE',
    description: 'the node token, shared by nodes and controllers (else $SANDGYM_NODE_TOKEN)',
  },
} as const satisfies OptionTable;

/** The TLS variables a cluster client reads, named after the server options. */
const TLS_VARIABLES = { ca: 'SANDGYM_TLS_CA', cert: 'SANDGYM_TLS_CERT', key: 'SANDGYM_TLS_KEY' } as const;

/**
 * A server's TLS material from --tls-ca/--tls-cert/--tls-key: all three or none. A server with
 * TLS requires its clients to present a certificate the same CA signed.
 */
export async function serverTls(command: string, parsed: ParsedCommandArgs): Promise<TlsFiles | undefined> {
  const ca = text(parsed, 'tls-ca');
  const cert = text(parsed, 'tls-cert');
  const key = text(parsed, 'tls-key');
  if (!ca && !cert && !key) return undefined;
  if (!ca || !cert || !key) {
    throw new UsageError(
      `sandgym ${command}: give --tls-ca, --tls-cert and --tls-key together (\`sandgym certs --out DIR\` makes a development set)`,
    );
  }
  return readTlsFiles({ ca, cert, key });
}

/**
 * A cluster client's TLS material from $SANDGYM_TLS_CA (and, for mutual TLS, $SANDGYM_TLS_CERT
 * and $SANDGYM_TLS_KEY); none without $SANDGYM_TLS_CA.
 */
export async function clientTls(): Promise<TlsFiles | undefined> {
  const ca = process.env[TLS_VARIABLES.ca];
  const cert = process.env[TLS_VARIABLES.cert];
  const key = process.env[TLS_VARIABLES.key];
  if (!ca) {
    if (cert || key)
      throw new UsageError(`${TLS_VARIABLES.cert}/${TLS_VARIABLES.key} need ${TLS_VARIABLES.ca} too`);
    return undefined;
  }
  return readTlsFiles({ ca, ...(cert ? { cert } : {}), ...(key ? { key } : {}) });
}

/** etcd endpoints from --etcd URL,URL (TLS files serve https:// ones too), or undefined. */
export function etcdOption(parsed: ParsedCommandArgs, tls: TlsFiles | undefined): EtcdOptions | undefined {
  const endpoints = (text(parsed, 'etcd') ?? '').split(',').filter(Boolean);
  if (endpoints.length === 0) return undefined;
  checkEtcdEndpoints(endpoints);
  return { endpoints, ...(tls ? { tls } : {}) };
}

/** The token a metrics scrape must send, from --metrics-token-file; none without it. */
export async function metricsToken(command: string, file: string | undefined): Promise<string | undefined> {
  if (!file) return undefined;
  const token = (
    await readFile(file, 'utf8').catch((error: unknown) => {
      throw new UsageError(`sandgym ${command}: cannot read --metrics-token-file ${file}: ${String(error)}`);
    })
  ).trim();
  if (!token) throw new UsageError(`sandgym ${command}: --metrics-token-file ${file} is empty`);
  return token;
}

/** The node token: from a file (so it stays out of `ps`), else $SANDGYM_NODE_TOKEN. */
export async function nodeToken(command: string, file: string | undefined): Promise<string> {
  const token = file ? (await readFile(file, 'utf8')).trim() : process.env['SANDGYM_NODE_TOKEN'];
  if (!token) {
    throw new UsageError(
      `sandgym ${command}: no node token; set SANDGYM_NODE_TOKEN or pass --node-token-file FILE (the same on every node and controller)`,
    );
  }
  return token;
}
