/* global process, console, Buffer */
// A hostile tenant's client for the budget tests: fires calls with large request bodies at once
// over raw gRPC (no resending, no queueing of its own), and prints one JSON line: each call's
// gRPC status code and details, in order. It runs as its own process so that the bodies it builds
// do not count in the memory of the test process, where the servers under test run.
// usage: node flood-client.mjs ADDRESS TOKEN PROJECT|- CALLS_JSON [gzip]
//   CALLS_JSON: [{ "method": "/sandgym.v1.Sandboxes/WriteFile", "count": 16, "mib": 64, "target": "<sandbox or env id>" }, ...]
//   gzip: compress every body, so a few KiB on the wire inflate to what they carry on the server
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const grpc = require('@grpc/grpc-js');
const { Packr } = require('msgpackr');

const [address, token, project, callsJson, compression] = process.argv.slice(2);
const packr = new Packr({ useRecords: false, mapsAsObjects: true });
const client = new grpc.Client(address, grpc.credentials.createInsecure(), {
  'grpc.max_send_message_length': 128 * 2 ** 20,
  'grpc.max_receive_message_length': 128 * 2 ** 20,
  ...(compression === 'gzip' ? { 'grpc.default_compression_algorithm': 2 } : {}),
});

/** The request body of a call of `method` carrying about `mib` MiB (built once, sent by every call). */
function body(method, mib, target, index = 0) {
  const bytes = Buffer.alloc(mib * 2 ** 20, 0x61);
  switch (method.split('/').pop()) {
    case 'WriteFile':
      return { sandboxId: target, path: `/flood-${index}`, data: bytes };
    case 'Exec':
    case 'ExecCollected':
      return { sandboxId: target, argv: ['true'], stdin: bytes };
    case 'Step':
      return method.includes('Envs')
        ? {
            envId: target,
            stepIndex: index,
            action: { type: 'write_file', path: '/x', content: bytes.toString() },
          }
        : {
            sandboxId: target,
            episodeId: 'flood',
            stepIndex: index,
            action: { type: 'write_file', path: `/flood-${index}`, content: bytes.toString() },
          };
    default:
      throw new Error(`no body for ${method}`);
  }
}

function call(method, bytes) {
  const metadata = new grpc.Metadata();
  metadata.set('authorization', `Bearer ${token}`);
  if (project !== '-') metadata.set('sandgym-project', project);
  return new Promise((done) => {
    const settle = (error) => done(error ? { code: error.code, details: error.details } : { code: 0 });
    if (method.endsWith('/Exec')) {
      const stream = client.makeServerStreamRequest(
        method,
        (b) => b,
        (b) => b,
        bytes,
        metadata,
        {},
      );
      stream.on('data', () => undefined);
      stream.on('error', settle);
      stream.on('end', () => settle(null));
    } else {
      client.makeUnaryRequest(
        method,
        (b) => b,
        (b) => b,
        bytes,
        metadata,
        {},
        settle,
      );
    }
  });
}

const calls = JSON.parse(callsJson).flatMap(({ method, count, mib, target }) => {
  const bytes = packr.pack(body(method, mib, target));
  return Array.from({ length: count }, () => () => call(method, bytes));
});
const results = await Promise.all(calls.map((start) => start()));
console.log(JSON.stringify(results));
client.close();
