import { readFile } from 'node:fs/promises';
import { isIP, type Socket } from 'node:net';
import { connect, createSecureContext, type SecureContext } from 'node:tls';
import {
  CallCredentials,
  ChannelCredentials,
  ServerCredentials,
  credentials,
  type experimental,
} from '@grpc/grpc-js';
import { SandgymError } from '../../common/index.ts';

/** PEM material for TLS: the CA that signs every peer, and this process's certificate and key. */
export interface TlsFiles {
  ca: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

/** Paths of {@link TlsFiles}, as given on the command line or in the environment. */
export interface TlsPaths {
  ca: string;
  cert?: string;
  key?: string;
}

/** Reads TLS files, naming the one that cannot be read. A certificate needs its key and back. */
export async function readTlsFiles(paths: TlsPaths): Promise<TlsFiles> {
  if (Boolean(paths.cert) !== Boolean(paths.key)) {
    throw new SandgymError(
      'invalid_argument',
      'Give the TLS certificate and its key together (--tls-cert and --tls-key)',
    );
  }
  const read = async (path: string, what: string): Promise<Buffer> => {
    try {
      const pem = await readFile(path);
      if (!pem.includes('-----BEGIN ')) throw new Error('not a PEM file');
      return pem;
    } catch (error) {
      throw new SandgymError(
        'invalid_argument',
        `Cannot use ${path} as the TLS ${what}: ${error instanceof Error ? error.message : String(error)}; \`sandgym certs\` makes a development set`,
      );
    }
  };
  return {
    ca: await read(paths.ca, 'CA certificate'),
    ...(paths.cert && paths.key
      ? { cert: await read(paths.cert, 'certificate'), key: await read(paths.key, 'key') }
      : {}),
  };
}

/**
 * Server credentials: TLS with this process's pair, and every client must present a certificate
 * the CA signed (mutual TLS), so a stolen token alone does not reach a node or a controller.
 */
export function serverCredentials(tls: TlsFiles | undefined): ServerCredentials {
  if (!tls) return ServerCredentials.createInsecure();
  if (!tls.cert || !tls.key) {
    throw new SandgymError(
      'invalid_argument',
      'A TLS server needs its certificate and key (--tls-cert, --tls-key)',
    );
  }
  return ServerCredentials.createSsl(tls.ca, [{ cert_chain: tls.cert, private_key: tls.key }], true);
}

/** Client credentials: the server must prove itself with a certificate the CA signed. */
export function channelCredentials(tls: TlsFiles | undefined): ChannelCredentials {
  if (!tls) return credentials.createInsecure();
  return new TlsDialCredentials(tls);
}

/**
 * The options of a TLS dial to `host`: SNI only for a DNS name. grpc-js sends any host as the
 * server name, and an IP address there is against RFC 6066: Node then prints a DEP0123 warning
 * into stderr, which the servers keep for JSON-lines logs. The certificate is checked against
 * `host` either way (an IP address against its IP entries).
 */
export function dialOptions(host: string): { host: string; servername?: string; ALPNProtocols: string[] } {
  return { host, ...(isIP(host) ? {} : { servername: host }), ALPNProtocols: ['h2'] };
}

/** The host of a gRPC target (`dns:name:port`, `name:port`, `[::1]:port`), when it names one. */
export function targetHost(target: string): string | undefined {
  const match = /^(?:dns:(?:\/\/[^/]*\/)?)?(\[[^\]]+\]|[^:,/]+):\d+$/.exec(target);
  return match?.[1]?.replace(/^\[|\]$/g, '');
}

/**
 * grpc-js's TLS credentials, but dialled as {@link dialOptions} says. A target of several IP
 * addresses (`ipv4:a:p,b:p`) names no one host: each connection checks the certificate against
 * the address it reached.
 */
class TlsDialCredentials extends ChannelCredentials {
  private readonly context: SecureContext;

  constructor(tls: TlsFiles) {
    super();
    this.context = createSecureContext({
      ca: tls.ca,
      ...(tls.cert && tls.key ? { cert: tls.cert, key: tls.key } : {}),
    });
  }

  _isSecure(): boolean {
    return true;
  }

  _equals(other: ChannelCredentials): boolean {
    return other === this;
  }

  _createSecureConnector(
    target: experimental.GrpcUri,
    _options: unknown,
    callCredentials?: CallCredentials,
  ): experimental.SecureConnector {
    const named = targetHost(target.path);
    const perCall = callCredentials ?? CallCredentials.createEmpty();
    return {
      connect: (socket: Socket) =>
        new Promise((resolve, reject) => {
          const host = named ?? socket.remoteAddress ?? '';
          const secure = connect({ socket, secureContext: this.context, ...dialOptions(host) }, () =>
            resolve({ socket: secure, secure: true }),
          );
          // kept after the handshake too: grpc-js watches the session, an unheard error would crash
          secure.on('error', reject);
        }),
      waitForReady: () => Promise.resolve(),
      getCallCredentials: () => perCall,
      destroy: () => undefined,
    };
  }
}
