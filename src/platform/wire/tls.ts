import { readFile } from 'node:fs/promises';
import { ServerCredentials, credentials, type ChannelCredentials } from '@grpc/grpc-js';
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
  return credentials.createSsl(tls.ca, tls.key ?? null, tls.cert ?? null);
}
