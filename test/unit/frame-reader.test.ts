import { describe, expect, it } from 'vitest';
import { FrameReader, frame } from '../../src/backends/internal/frame-reader.ts';
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
    for (let i = 0; i < bytes.length; i += 3) frames.push(...reader.push(bytes.subarray(i, i + 3)));
    expect(frames.map((f) => (f.length ? codec.decode(f) : null))).toEqual([{ a: 1 }, { b: 'two' }, null]);
  });

  it('joins a large frame once, not once per chunk', () => {
    const body = Buffer.alloc(1 << 20, 7);
    const bytes = frame(body);
    const reader = new FrameReader(2 << 20);
    let out: Buffer[] = [];
    for (let i = 0; i < bytes.length; i += 4096) out = out.concat(reader.push(bytes.subarray(i, i + 4096)));
    expect(out).toHaveLength(1);
    expect(out[0]?.equals(body)).toBe(true);
  });

  it('refuses a frame over the limit as an agent failure', () => {
    const reader = new FrameReader(10);
    expect(() => reader.push(frame(Buffer.alloc(11)))).toThrow(/over the 10-byte limit/);
  });

  it('encodes plain msgpack maps that any decoder reads', () => {
    const encoded = createMsgpackCodec().encode({ op: 'ping', id: 1 });
    // a map header (fixmap or map16), never msgpackr's record extension
    expect([0x82, 0xde]).toContain(encoded[0]);
    expect(encoded.includes(Buffer.from('\xa2op\xa4ping\xa2id\x01', 'latin1'))).toBe(true);
  });
});
