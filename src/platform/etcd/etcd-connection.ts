import { Etcd3, type IOptions } from 'etcd3';
import { SandgymError } from '../../common/index.ts';
import type { TlsFiles } from '../wire/index.ts';

/** Where the cluster's shared state lives: etcd endpoints, and TLS material for `https://` ones. */
export interface EtcdOptions {
  /** Client URLs of the etcd members, e.g. `http://10.0.0.5:2379`. */
  endpoints: string[];
  /** For `https://` endpoints: the CA that signed etcd's certificates, and this process's pair. */
  tls?: TlsFiles;
}

/** A connection to etcd, as the rest of the platform holds it. */
export type EtcdClient = Etcd3;

/** Every key sandgym writes lives under this prefix, so one etcd can serve other users too. */
export const ETCD_PREFIX = '/sandgym/';

/** How long one etcd call may take before it fails. */
const CALL_TIMEOUT_MS = 5_000;

const ENDPOINT = /^https?:\/\/[^/\s]+:\d{1,5}\/?$/;

/** Refuses endpoints etcd clients cannot dial, naming the first bad one. */
export function checkEtcdEndpoints(endpoints: string[]): void {
  const bad = endpoints.find((endpoint) => !ENDPOINT.test(endpoint));
  if (endpoints.length === 0 || bad !== undefined) {
    throw new SandgymError(
      'invalid_argument',
      `etcd endpoints must be URLs like http://10.0.0.5:2379 (https:// with TLS); got "${bad ?? ''}"`,
    );
  }
}

/**
 * Connects to etcd and proves it answers, so a wrong endpoint fails at start-up with a message
 * naming it rather than at the first placement.
 */
export async function connectEtcd(options: EtcdOptions, timeoutMs = 10_000): Promise<Etcd3> {
  checkEtcdEndpoints(options.endpoints);
  const secure = options.endpoints.some((endpoint) => endpoint.startsWith('https://'));
  if (secure && !options.tls) {
    throw new SandgymError(
      'invalid_argument',
      'https:// etcd endpoints need TLS files (--tls-ca, --tls-cert, --tls-key)',
    );
  }
  const settings: IOptions = {
    hosts: options.endpoints,
    dialTimeout: timeoutMs,
    // a call to an etcd that stopped answering fails rather than holding a create forever;
    // watches and keepalives are streams and reconnect by themselves
    defaultCallOptions: (context) => (context.isStream ? {} : { deadline: Date.now() + CALL_TIMEOUT_MS }),
    ...(secure && options.tls
      ? {
          credentials: {
            rootCertificate: options.tls.ca,
            ...(options.tls.cert && options.tls.key
              ? { certChain: options.tls.cert, privateKey: options.tls.key }
              : {}),
          },
        }
      : {}),
  };
  const client = new Etcd3(settings);
  try {
    await client
      .get(`${ETCD_PREFIX}ping`)
      .options({ deadline: Date.now() + timeoutMs })
      .exec();
  } catch (error) {
    client.close();
    throw new SandgymError(
      'platform_error',
      `etcd at ${options.endpoints.join(',')} does not answer: ${error instanceof Error ? error.message : String(error)}`,
      { retryable: true },
    );
  }
  return client;
}
