import { spawn } from 'node:child_process';
import { createSocket, type Socket } from 'node:dgram';
import { once } from 'node:events';
import { parseQuery } from '../../src/backends/host/dns-message.ts';

/**
 * A stand-in resolver on `address`: names under `.invalid` do not exist (NXDOMAIN), every other
 * name is 10.0.0.1. It keeps each query it got and its sender's port, and leaves the names in
 * `hold` unanswered.
 */
export interface FakeResolver extends AsyncDisposable {
  socket: Socket;
  port: number;
  got: Buffer[];
  senders: number[];
  hold: Set<string>;
}

export async function startFakeResolver(address: string, port = 0): Promise<FakeResolver> {
  const socket = createSocket('udp4');
  const got: Buffer[] = [];
  const senders: number[] = [];
  const hold = new Set<string>();
  socket.on('message', (packet, from) => {
    got.push(packet);
    senders.push(from.port);
    const asked = parseQuery(packet);
    if (!asked || hold.has(asked.question.name)) return;
    const answer = Buffer.from(packet.subarray(0, 12 + asked.question.wire.length + 4));
    const missing = asked.question.name.endsWith('.invalid');
    // only an A question gets the address; others exist with no records of their type
    const record = !missing && asked.question.type === 1;
    answer.writeUInt16BE(0x8180 | (missing ? 3 : 0), 2);
    answer.writeUInt16BE(record ? 1 : 0, 6);
    answer.writeUInt16BE(0, 10);
    const a = Buffer.from([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 0, 0, 1]);
    socket.send(record ? Buffer.concat([answer, a]) : answer, from.port, from.address);
  });
  await new Promise<void>((resolve) => socket.bind(port, address, resolve));
  return {
    socket,
    port: socket.address().port,
    got,
    senders,
    hold,
    [Symbol.asyncDispose]: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

/**
 * The same stand-in resolver, run in the network namespace `netns` on `address`:53 (a node
 * process of its own, as a socket cannot change namespace); `asked` lists the names it was asked.
 */
export async function startFakeResolverIn(
  netns: string,
  address: string,
): Promise<AsyncDisposable & { asked: string[] }> {
  const asked: string[] = [];
  const child = spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', RESOLVER_SCRIPT, address], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let buffered = '';
  await new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`the stand-in resolver exited (${code})`)));
    child.stdout.on('data', (chunk: Buffer) => {
      buffered += chunk.toString();
      const lines = buffered.split('\n');
      buffered = lines.pop() ?? '';
      for (const line of lines) {
        if (line === 'ready') resolve();
        else asked.push(line);
      }
    });
  });
  child.removeAllListeners('exit');
  return {
    asked,
    [Symbol.asyncDispose]: async () => {
      child.kill('SIGKILL');
      await once(child, 'close');
    },
  };
}

/** {@link startFakeResolver}'s answers, in plain JavaScript for a process of its own. */
const RESOLVER_SCRIPT = `
const socket = require('node:dgram').createSocket('udp4');
socket.on('message', (packet, from) => {
  if (packet.length < 17) return;
  const labels = [];
  let at = 12;
  while (at < packet.length && packet[at] > 0 && packet[at] < 64) {
    labels.push(packet.subarray(at + 1, at + 1 + packet[at]).toString('latin1').toLowerCase());
    at += 1 + packet[at];
  }
  if (at + 5 > packet.length) return;
  const name = labels.join('.');
  const type = packet.readUInt16BE(at + 1);
  process.stdout.write(name + '\\n');
  const answer = Buffer.from(packet.subarray(0, at + 5));
  const missing = name.endsWith('.invalid');
  const record = !missing && type === 1;
  answer.writeUInt16BE(0x8180 | (missing ? 3 : 0), 2);
  answer.writeUInt16BE(record ? 1 : 0, 6);
  answer.writeUInt16BE(0, 10);
  const a = Buffer.from([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 0, 0, 1]);
  socket.send(record ? Buffer.concat([answer, a]) : answer, from.port, from.address);
});
socket.bind(53, process.argv[1], () => process.stdout.write('ready\\n'));
`;
