import { access, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeFileAtomic } from '../../common/index.ts';
import { runProgram } from '../../backends/index.ts';
import { jsonOutput, numberOf, text } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/** What `sandgym certs` leaves in its folder. */
const FILES = {
  ca: 'ca.pem',
  caKey: 'ca-key.pem',
  server: 'server.pem',
  serverKey: 'server-key.pem',
  client: 'client.pem',
  clientKey: 'client-key.pem',
} as const;

const HOST_NAME = /^[A-Za-z0-9.-]{1,253}$/;
const IPV4 = /^\d{1,3}(?:\.\d{1,3}){3}$/;
const IPV6 = /^[0-9a-fA-F:]+$/;

/** The subjectAltName entries of the server certificate: DNS names and IP addresses. */
function altNames(hosts: string[]): string {
  return hosts
    .map((host) => {
      if (IPV4.test(host) || (host.includes(':') && IPV6.test(host))) return `IP:${host}`;
      if (HOST_NAME.test(host)) return `DNS:${host}`;
      throw new UsageError(`sandgym certs: "${host}" is not a host name or an IP address`);
    })
    .join(',');
}

export const CERTS_COMMAND = {
  name: 'certs',
  summary: 'a development CA and certificates for mutual TLS, made with openssl',
  details:
    'server.pem is for node agents and controllers; client.pem for clients. A CA already in DIR is kept.',
  options: {
    out: { type: 'string', value: 'DIR', description: 'the folder they go in' },
    hosts: {
      type: 'string',
      value: 'HOST,...',
      default: 'localhost,127.0.0.1',
      description: 'the names and addresses servers are dialled by',
    },
    days: { type: 'integer', range: [1, 36_500], default: 365, description: 'how long they are valid' },
    ...JSON_OPTION,
  },
} as const satisfies CommandSpec;

/**
 * `sandgym certs --out DIR [--hosts localhost,127.0.0.1,...] [--days 365]`: a development CA and
 * certificates signed by it, made with openssl. `server.pem` is for node agents and controllers
 * (it names the hosts they are dialled by, and serves as the client certificate a controller
 * shows nodes); `client.pem` is for clients of a controller that asks for mutual TLS. An existing
 * CA in DIR is kept, so certificates made later are trusted by everything made before.
 */
export async function certsCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(CERTS_COMMAND, args);
  const out = text(parsed, 'out');
  if (!out) throw new UsageError('sandgym certs: give --out DIR (the CA there is kept if it exists)');
  const hosts = (text(parsed, 'hosts') ?? '').split(',').filter(Boolean);
  const days = String(numberOf(parsed, 'days'));
  // the server certificate's names, checked before openssl makes anything
  const subjectAltNames = altNames(hosts);
  const json = await jsonOutput(parsed);
  await mkdir(out, { recursive: true, mode: 0o700 });
  const haveCa = await access(join(out, FILES.caKey)).then(
    () => true,
    () => false,
  );
  const work = await mkdtemp(join(tmpdir(), 'sandgym-certs-'));
  try {
    const openssl = async (...argv: string[]): Promise<void> => {
      await runProgram('openssl', argv, { cwd: work });
    };
    const keyArgs = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
    if (haveCa) {
      await writeFile(join(work, FILES.ca), await readFile(join(out, FILES.ca)));
      await writeFile(join(work, FILES.caKey), await readFile(join(out, FILES.caKey)), { mode: 0o600 });
    } else {
      await openssl(
        'req',
        '-x509',
        ...keyArgs,
        '-keyout',
        FILES.caKey,
        '-out',
        FILES.ca,
        '-days',
        days,
        '-subj',
        '/CN=sandgym development CA',
        '-addext',
        'basicConstraints=critical,CA:TRUE',
        '-addext',
        'keyUsage=critical,keyCertSign,cRLSign',
      );
    }
    const issue = async (name: string, key: string, subject: string, extensions: string[]): Promise<void> => {
      await openssl('req', ...keyArgs, '-keyout', key, '-out', `${name}.csr`, '-subj', subject);
      await writeFile(join(work, `${name}.ext`), `${extensions.join('\n')}\n`);
      await openssl(
        'x509',
        '-req',
        '-in',
        `${name}.csr`,
        '-CA',
        FILES.ca,
        '-CAkey',
        FILES.caKey,
        '-CAcreateserial',
        '-days',
        days,
        '-out',
        name,
        '-extfile',
        `${name}.ext`,
      );
    };
    await issue(FILES.server, FILES.serverKey, '/CN=sandgym-server', [
      'basicConstraints=CA:FALSE',
      'keyUsage=critical,digitalSignature,keyEncipherment',
      'extendedKeyUsage=serverAuth,clientAuth',
      `subjectAltName=${subjectAltNames}`,
    ]);
    await issue(FILES.client, FILES.clientKey, '/CN=sandgym-client', [
      'basicConstraints=CA:FALSE',
      'keyUsage=critical,digitalSignature,keyEncipherment',
      'extendedKeyUsage=clientAuth',
    ]);
    for (const [name, secret] of [
      [FILES.ca, false],
      [FILES.caKey, true],
      [FILES.server, false],
      [FILES.serverKey, true],
      [FILES.client, false],
      [FILES.clientKey, true],
    ] as const) {
      await writeFileAtomic(join(out, name), await readFile(join(work, name)), {
        mode: secret ? 0o600 : 0o644,
      });
    }
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  console.error(
    `sandgym certs: ${haveCa ? 'kept the CA and made' : 'made a CA and'} certificates in ${out}; servers: --tls-ca ${join(out, FILES.ca)} --tls-cert ${join(out, FILES.server)} --tls-key ${join(out, FILES.serverKey)}; clients: SANDGYM_TLS_CA, SANDGYM_TLS_CERT=${join(out, FILES.client)}, SANDGYM_TLS_KEY=${join(out, FILES.clientKey)}`,
  );
  await json?.write(Object.fromEntries(Object.entries(FILES).map(([role, file]) => [role, join(out, file)])));
  return EXIT.ok;
}
