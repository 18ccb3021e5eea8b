import { createSocket, type Socket } from 'node:dgram';
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
