import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { AgentChannel } from '../../src/backends/internal/agent-channel.ts';
import { MAX_FRAME_BYTES } from '../../src/backends/internal/agent-protocol.ts';
import { FrameReader, frame, replyIdOf } from '../../src/backends/internal/frame-reader.ts';
import { createMsgpackCodec } from '../../src/common/index.ts';

describe('agent channel framing', () => {
  it('splits frames that arrive in arbitrary pieces', () => {
    const codec = createMsgpackCodec();
    const bytes = Buffer.concat([
      frame(codec.encode({ a: 1 })),
      frame(codec.encode({ b: 'two' })),
      frame(Buffer.alloc(0)),
    ]);
    const reader = new FrameReader(1024);
    const frames: Buffer[] = [];
    for (let i = 0; i < bytes.length; i += 3)
      frames.push(...(reader.push(bytes.subarray(i, i + 3)) as Buffer[]));
    expect(frames.map((f) => (f.length ? codec.decode(f) : null))).toEqual([{ a: 1 }, { b: 'two' }, null]);
  });

  it('joins a large frame once, not once per chunk', () => {
    const body = Buffer.alloc(1 << 20, 7);
    const bytes = frame(body);
    const reader = new FrameReader(2 << 20);
    let out: Buffer[] = [];
    for (let i = 0; i < bytes.length; i += 4096)
      out = out.concat(reader.push(bytes.subarray(i, i + 4096)) as Buffer[]);
    expect(out).toHaveLength(1);
    expect(out[0]?.equals(body)).toBe(true);
  });

  it("skips a frame over the limit, reports whose reply it was and keeps the stream's frames", () => {
    const codec = createMsgpackCodec();
    const big = frame(codec.encode({ t: 'ok', id: 300, data: Buffer.alloc(5000, 1) }));
    const bytes = Buffer.concat([big, frame(codec.encode({ t: 'ok', id: 301 }))]);
    const reader = new FrameReader(1024);
    const out = [];
    for (let i = 0; i < bytes.length; i += 100) out.push(...reader.push(bytes.subarray(i, i + 100)));
    expect(out).toHaveLength(2);
    const [oversized, next] = out;
    expect(Buffer.isBuffer(oversized)).toBe(false);
    expect(replyIdOf((oversized as { head: Buffer }).head)).toBe(300);
    expect(codec.decode(next as Buffer)).toEqual({ t: 'ok', id: 301 });
    expect(replyIdOf(codec.encode({ t: 'error', id: 70000 }))).toBe(70000);
    expect(replyIdOf(codec.encode({ x: 1 }))).toBeUndefined();
  });

  it('encodes plain msgpack maps that any decoder reads', () => {
    const encoded = createMsgpackCodec().encode({ op: 'ping', id: 1 });
    // a map header (fixmap or map16), never msgpackr's record extension
    expect([0x82, 0xde]).toContain(encoded[0]);
    expect(encoded.includes(Buffer.from('\xa2op\xa4ping\xa2id\x01', 'latin1'))).toBe(true);
  });
});

describe('agent channel replies over the frame limit', () => {
  it('fails only the call whose reply it was; the channel and later calls go on', async () => {
    const codec = createMsgpackCodec();
    const toAgent = new PassThrough();
    const fromAgent = new PassThrough();
    const channel = new AgentChannel(toAgent, fromAgent, codec);
    const big = channel.call({ op: 'list', path: '/wide' });
    const small = channel.call({ op: 'list', path: '/srv' });
    // the agent answers the first with a frame one byte over the limit, in pieces
    const head = codec.encode({ t: 'ok', id: 1, entries: [] });
    const oversized = Buffer.alloc(4 + MAX_FRAME_BYTES + 1);
    oversized.writeUInt32BE(MAX_FRAME_BYTES + 1, 0);
    head.copy(oversized, 4);
    for (let at = 0; at < oversized.length; at += 1 << 20)
      fromAgent.write(oversized.subarray(at, at + (1 << 20)));
    fromAgent.write(frame(codec.encode({ t: 'ok', id: 2, entries: [] })));
    await expect(big).rejects.toMatchObject({ code: 'resource_exhausted' });
    await expect(small).resolves.toMatchObject({ id: 2, entries: [] });
    expect(channel.isClosed).toBe(false);
  });
});
