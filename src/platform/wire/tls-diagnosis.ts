import { connect as dialPlain } from 'node:net';
import { connect as dialTls, createSecureContext } from 'node:tls';
import { dialOptions, targetHost, type TlsFiles } from './tls.ts';

/** How long one probe may take: a server that says nothing in that time is not diagnosed. */
const PROBE_MS = 3_000;

/** Where to point the fix, for clients and for servers that dial (a controller dials nodes). */
const CLIENT_VARIABLES = 'SANDGYM_TLS_CA, SANDGYM_TLS_CERT and SANDGYM_TLS_KEY';
const CLIENT_TLS = `${CLIENT_VARIABLES} (a controller: --tls-ca, --tls-cert, --tls-key)`;

/** The first frame an HTTP/2 client sends: its preface and empty settings. */
const H2_PREFACE = Buffer.concat([
  Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
  Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]),
]);
const H2_SETTINGS = 4;

/** Errors of a server certificate this client's CA did not sign. */
const FOREIGN_SERVER = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_SIGNATURE_FAILURE',
]);

/** Alerts of a server that refused this client's certificate. */
const CLIENT_REFUSED = new Set([
  'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA',
  'ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE',
  'ERR_SSL_TLSV1_ALERT_DECRYPT_ERROR',
]);

/** Alerts of a server that wanted a client certificate and got none. */
const CERT_REQUIRED = new Set([
  'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED',
  'ERR_SSL_SSLV3_ALERT_HANDSHAKE_FAILURE',
]);

type Probe =
  | { kind: 'data' }
  | { kind: 'closed'; handshook: boolean }
  | { kind: 'error'; code: string; handshook: boolean }
  | { kind: 'silent' };

/**
 * Why the server at `target` refuses this client's connection, when it is a TLS mismatch: a
 * plaintext client and a TLS server or the other way round, no client certificate, a server
 * certificate of another CA or another name, a client certificate the server's CA did not sign.
 * Undefined for anything else (nothing listens, a network fault), which retrying may cure. gRPC
 * only says it cannot connect, and retries for as long as the caller waits, so a client that
 * could never connect would wait out its whole deadline to learn nothing; this asks once, on a
 * connection of its own, as gRPC would dial.
 */
export async function tlsMismatch(target: string, tls: TlsFiles | undefined): Promise<string | undefined> {
  // a probe that cannot even start diagnoses nothing: the caller's own error stands
  return diagnose(target, tls).catch(() => undefined);
}

async function diagnose(target: string, tls: TlsFiles | undefined): Promise<string | undefined> {
  const address = firstAddress(target);
  if (!address) return undefined;
  if (!tls) {
    const probe = await probeTls(address, undefined);
    const speaksTls = probe.kind === 'data' || (probe.kind !== 'silent' && probe.handshook);
    return speaksTls
      ? `it speaks TLS and this client dials in plaintext: set ${CLIENT_TLS} to the files of its CA`
      : undefined;
  }
  const probe = await probeTls(address, tls);
  if (probe.kind === 'data' || probe.kind === 'silent') return undefined;
  if (probe.kind === 'closed') {
    // a gRPC server speaks first once the handshake is done: closing instead is a refusal
    return probe.handshook && tls.cert ? refusedCertificate() : undefined;
  }
  if (FOREIGN_SERVER.has(probe.code)) {
    return `its certificate is not signed by the CA this client trusts (${probe.code}): give both sides files of one CA (\`sandgym certs\` keeps the CA of its folder)`;
  }
  if (probe.code === 'ERR_TLS_CERT_ALTNAME_INVALID') {
    return `its certificate does not name ${address.host}: make one with \`sandgym certs --hosts ${address.host},...\` (the CA of the folder is kept)`;
  }
  if (probe.code === 'CERT_HAS_EXPIRED')
    return 'its certificate has expired: make a new one with `sandgym certs`';
  if (CERT_REQUIRED.has(probe.code) && !tls.cert) {
    return `it requires a client certificate and this client has none: set ${CLIENT_TLS}`;
  }
  if (CLIENT_REFUSED.has(probe.code) || CERT_REQUIRED.has(probe.code)) return refusedCertificate();
  if (!probe.handshook && (await speaksPlainHttp2(address))) {
    return `it speaks plaintext and this client dials with TLS: start the server with --tls-ca, --tls-cert and --tls-key, or unset ${CLIENT_VARIABLES}`;
  }
  return undefined;
}

function refusedCertificate(): string {
  return `it refused this client's certificate (its CA did not sign it): use a client certificate of the server's CA in ${CLIENT_TLS}`;
}

/** The first host and port of a gRPC target, `ipv4:a:p,b:p` included. */
function firstAddress(target: string): { host: string; port: number } | undefined {
  const first = target.replace(/^ipv[46]:/, '').split(',')[0] ?? '';
  const host = targetHost(first);
  const port = Number(/:(\d+)$/.exec(first)?.[1]);
  return host && port ? { host, port } : undefined;
}

/**
 * A TLS handshake with the server, as a client with `tls` (without: one that trusts any
 * certificate, to learn whether the server speaks TLS at all), and what came of it: the
 * server's first bytes, an error, or a close.
 */
function probeTls(address: { host: string; port: number }, tls: TlsFiles | undefined): Promise<Probe> {
  return new Promise((resolve) => {
    let handshook = false;
    const socket = dialTls({
      port: address.port,
      ...dialOptions(address.host),
      ...(tls
        ? {
            secureContext: createSecureContext({
              ca: tls.ca,
              ...(tls.cert && tls.key ? { cert: tls.cert, key: tls.key } : {}),
            }),
          }
        : { rejectUnauthorized: false }),
    });
    const done = (probe: Probe): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(probe);
    };
    const timer = setTimeout(() => done({ kind: 'silent' }), PROBE_MS);
    socket.on('secureConnect', () => (handshook = true));
    socket.on('data', () => done({ kind: 'data' }));
    socket.on('error', (error: NodeJS.ErrnoException) =>
      done({ kind: 'error', code: error.code ?? error.message, handshook }),
    );
    socket.on('close', () => done({ kind: 'closed', handshook }));
  });
}

/** Whether the server answers an HTTP/2 preface in plaintext with its settings, as gRPC does. */
function speaksPlainHttp2(address: { host: string; port: number }): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = dialPlain({ host: address.host, port: address.port }, () => socket.write(H2_PREFACE));
    let received = Buffer.alloc(0);
    const done = (answer: boolean): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(answer);
    };
    const timer = setTimeout(() => done(false), PROBE_MS);
    socket.on('data', (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      if (received.length >= 4) done(received[3] === H2_SETTINGS);
    });
    socket.on('error', () => done(false));
    socket.on('close', () => done(false));
  });
}
