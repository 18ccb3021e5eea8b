import { createSocket, type Socket } from 'node:dgram';
import fc from 'fast-check';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { MAX_DNS_PACKET, parseAnswerHead, parseQuery } from '../../src/backends/host/dns-message.ts';
import { DnsRelay } from '../../src/backends/host/dns-relay.ts';
import { startFakeResolver, type FakeResolver } from '../support/fake-resolver.ts';

// Sandboxes are loopback addresses here: the relay tells them apart by source address, as it
// does sandboxes on the node network. Nothing leaves loopback.
const A = '127.0.0.2';
const B = '127.0.0.3';
const STRANGER = '127.0.0.4';

/** A query for `name` (labels written as given, no checks: tests build broken ones on purpose). */
function query(id: number, name: string, extra: Buffer = Buffer.alloc(0), arcount = 0): Buffer {
  const header = Buffer.alloc(12);
  header.writeUInt16BE(id, 0);
  header.writeUInt16BE(0x0100, 2);
  header.writeUInt16BE(1, 4);
  header.writeUInt16BE(arcount, 10);
  const labels = name
    .split('.')
    .filter(Boolean)
    .map((label) => Buffer.concat([Buffer.from([label.length]), Buffer.from(label, 'latin1')]));
  return Buffer.concat([header, ...labels, Buffer.from([0, 0, 1, 0, 1]), extra]);
}

/** A sandbox's socket, with the answers it received. */
async function client(
  address: string,
): Promise<{ socket: Socket; answers: Buffer[]; next(): Promise<Buffer> }> {
  const socket = createSocket('udp4');
  const answers: Buffer[] = [];
  const waiters: ((packet: Buffer) => void)[] = [];
  socket.on('message', (packet) => {
    answers.push(packet);
    waiters.shift()?.(packet);
  });
  await new Promise<void>((resolve) => socket.bind(0, address, resolve));
  return { socket, answers, next: () => new Promise((resolve) => waiters.push(resolve)) };
}

describe('the sandbox resolver relay', () => {
  let resolver: FakeResolver;
  let relay: DnsRelay;
  let key: string;
  let port: number;
  const sockets: Socket[] = [];

  async function open(limits = {}): Promise<void> {
    relay = await DnsRelay.open('127.0.0.1', [{ address: '127.0.0.1', port: resolver.port }], limits);
    key = `127.0.0.1:${resolver.port}`;
    port = relay.portOf(key)!;
  }

  async function sandbox(address: string): Promise<Awaited<ReturnType<typeof client>>> {
    const made = await client(address);
    sockets.push(made.socket);
    return made;
  }

  /** Sends `packet` and waits for the next answer. */
  async function ask(who: Awaited<ReturnType<typeof client>>, packet: Buffer): Promise<Buffer> {
    const answer = who.next();
    who.socket.send(packet, port, '127.0.0.1');
    return answer;
  }

  beforeEach(async () => {
    resolver = await startFakeResolver('127.0.0.1');
  });

  afterEach(() => {
    relay?.close();
    resolver.socket.close();
    for (const socket of sockets.splice(0)) socket.close();
  });

  it('answers a sandbox its rules let ask, and keeps the names that did not resolve', async () => {
    await open();
    relay.permit(A, [key]);
    const a = await sandbox(A);
    const found = parseAnswerHead(await ask(a, query(0x1234, 'mirror.example')));
    expect(found).toMatchObject({ id: 0x1234, rcode: 0 });
    const missing = parseAnswerHead(await ask(a, query(0x4321, 'NoSuch.invalid')));
    expect(missing).toMatchObject({ id: 0x4321, rcode: 3 });
    expect(relay.unresolved(A)).toEqual(['nosuch.invalid']);
  });

  it('gives a sandbox without the dns rule no answers, and asks the resolver nothing for it', async () => {
    await open();
    relay.permit(A, []);
    const a = await sandbox(A);
    const refused = parseAnswerHead(await ask(a, query(7, 'archive.ubuntu.com')));
    expect(refused).toMatchObject({ id: 7, rcode: 5 });
    expect(resolver.got).toHaveLength(0);
    // it still says what it could not resolve
    expect(relay.unresolved(A)).toEqual(['archive.ubuntu.com']);
  });

  it('ignores a sender it does not know: no answer, no resolver query, no state', async () => {
    await open();
    relay.permit(A, [key]);
    const [stranger, a] = [await sandbox(STRANGER), await sandbox(A)];
    stranger.socket.send(query(1, 'mirror.example'), port, '127.0.0.1');
    await ask(a, query(2, 'mirror.example'));
    expect(stranger.answers).toHaveLength(0);
    expect(resolver.got).toHaveLength(1);
    expect(relay.unresolved(STRANGER)).toEqual([]);
  });

  it('never forwards the bytes a sandbox chose: only a query of its own for the one question', async () => {
    await open();
    relay.permit(A, [key]);
    const a = await sandbox(A);
    const smuggled = Buffer.from('SMUGGLED-PAYLOAD-'.repeat(20));
    // an additional record carrying 340 bytes of the agent's choosing
    const extra = Buffer.concat([Buffer.from([0, 0, 16, 0, 1, 0, 0, 0, 0, 1, 84]), smuggled]);
    await ask(a, query(3, 'mirror.example', extra, 1));
    expect(resolver.got).toHaveLength(1);
    expect(resolver.got[0]!.includes(Buffer.from('SMUGGLED'))).toBe(false);
    expect(resolver.got[0]!.length).toBeLessThan(64);
  });

  it('survives malformed queries (pointer loops, huge labels, truncation) and keeps answering', async () => {
    await open({ burst: 100_000 });
    relay.permit(A, [key]);
    const a = await sandbox(A);
    const loop = Buffer.concat([query(9, '').subarray(0, 12), Buffer.from([0xc0, 12, 0, 1, 0, 1])]);
    const hugeLabel = Buffer.concat([
      query(9, '').subarray(0, 12),
      Buffer.from([200]),
      Buffer.alloc(200, 0x61),
    ]);
    const longName = query(9, Array.from({ length: 60 }, () => 'abcdefgh').join('.'));
    const hostile = [
      loop,
      hugeLabel,
      longName,
      Buffer.alloc(0),
      Buffer.alloc(5),
      Buffer.alloc(MAX_DNS_PACKET + 1),
    ];
    for (const packet of hostile) a.socket.send(packet, port, '127.0.0.1');
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 300 }), (bytes) => {
        const packet = Buffer.from(bytes);
        expect(() => parseQuery(packet)).not.toThrow();
        expect(() => parseAnswerHead(packet)).not.toThrow();
      }),
      { seed: 29, numRuns: 2000 },
    );
    // the same kind of noise at the relay itself
    const noise = fc.sample(fc.uint8Array({ minLength: 12, maxLength: 300 }), { seed: 29, numRuns: 100 });
    for (const bytes of noise) a.socket.send(Buffer.from(bytes), port, '127.0.0.1');
    // mutations of a well-formed query: every byte flipped somewhere
    const good = query(5, 'mirror.example');
    for (let at = 0; at < good.length; at++)
      for (const value of [0, 0x3f, 0x40, 0xc0, 0xff]) {
        const mutated = Buffer.from(good);
        mutated[at] = value;
        expect(() => parseQuery(mutated)).not.toThrow();
      }
    const answer = parseAnswerHead(await ask(a, query(0x7777, 'after.example')));
    expect(answer).toMatchObject({ id: 0x7777, rcode: 0 });
    // nothing the relay could not parse reached the resolver
    for (const packet of resolver.got) expect(parseQuery(packet)).toBeDefined();
  });

  it("bounds a flood from one sandbox; its neighbour's queries are still answered", async () => {
    await open({ burst: 20, perSecond: 1 });
    relay.permit(A, [key]);
    relay.permit(B, [key]);
    const [a, b] = [await sandbox(A), await sandbox(B)];
    // paced so the kernel's socket buffer does not drop B's query (on the node network, the
    // nftables meter holds each sandbox to its rate before the relay's socket)
    for (let i = 0; i < 1000; i++) {
      await new Promise((resolve) => a.socket.send(query(i, `n${i}.invalid`), port, '127.0.0.1', resolve));
      if (i % 20 === 0) await new Promise((resolve) => setImmediate(resolve));
    }
    const answer = parseAnswerHead(await ask(b, query(0x2222, 'mirror.example')));
    expect(answer).toMatchObject({ id: 0x2222, rcode: 0 });
    const fromA = resolver.got.filter((packet) => parseQuery(packet)?.question.name.startsWith('n'));
    expect(fromA.length).toBeLessThanOrEqual(21);
    expect(relay.unresolved(A).length).toBeLessThanOrEqual(16);
  });

  it("keeps each sandbox's records its own: one cannot see, fill or clear another's", async () => {
    await open();
    relay.permit(A, [key]);
    relay.permit(B, [key]);
    const [a, b] = [await sandbox(A), await sandbox(B)];
    await ask(a, query(1, 'secret-of-a.invalid'));
    for (let i = 0; i < 20; i++) await ask(b, query(i, `b${i}.invalid`));
    expect(relay.unresolved(A)).toEqual(['secret-of-a.invalid']);
    expect(relay.unresolved(B)).not.toContain('secret-of-a.invalid');
    expect(relay.unresolved(B)).toHaveLength(16);
  });

  it("sends a late answer nowhere once its sandbox is gone, not to the address's next holder", async () => {
    await open();
    relay.permit(A, [key]);
    const first = await sandbox(A);
    resolver.hold.add('slow.example');
    first.socket.send(query(1, 'slow.example'), port, '127.0.0.1');
    // the resolver has it, unanswered
    while (resolver.got.length === 0) await new Promise((resolve) => setImmediate(resolve));
    relay.forget(A);
    relay.permit(A, [key]);
    const asked = parseQuery(resolver.got[0]!)!;
    const late = Buffer.from(resolver.got[0]!);
    late.writeUInt16BE(0x8183, 2); // NXDOMAIN
    resolver.socket.send(late, resolver.senders[0], '127.0.0.1');
    expect(asked.question.name).toBe('slow.example');
    const next = parseAnswerHead(await ask(first, query(2, 'mirror.example')));
    expect(next).toMatchObject({ id: 2 });
    expect(first.answers).toHaveLength(1);
    expect(relay.unresolved(A)).toEqual([]);
  });
});
