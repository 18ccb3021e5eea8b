/** A frame over the limit: skipped, never kept; its first bytes say whose reply it was. */
export interface OversizedFrame {
  oversized: number;
  head: Buffer;
}

/** How much of an oversized frame is kept: enough for the reply's type and request id. */
const HEAD_BYTES = 64;

/**
 * Splits a byte stream into length-prefixed frames (4-byte big-endian length). Chunks are joined
 * only when a frame is complete, so a large frame costs one copy, not one per chunk. A frame over
 * the limit is skipped as it arrives and reported by its head: one reply too large for the host
 * is that call's failure, not the channel's (the stream stays in step after it).
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;
  /** Bytes of an oversized frame still to drop. */
  private skipping = 0;

  constructor(private readonly maxFrameBytes: number) {}

  /** Adds a chunk and returns every frame it completed, and every oversized one it began. */
  push(chunk: Buffer): (Buffer | OversizedFrame)[] {
    if (this.skipping) {
      const dropped = Math.min(this.skipping, chunk.length);
      this.skipping -= dropped;
      chunk = chunk.subarray(dropped);
    }
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const frames: (Buffer | OversizedFrame)[] = [];
    for (;;) {
      if (this.buffered < 4) break;
      const head = this.peek(4);
      const length = head.readUInt32BE(0);
      if (length > this.maxFrameBytes) {
        if (this.buffered < 4 + HEAD_BYTES) break;
        const whole = this.peek(4 + HEAD_BYTES);
        frames.push({ oversized: length, head: Buffer.from(whole.subarray(4, 4 + HEAD_BYTES)) });
        const kept = Math.min(this.buffered, 4 + length);
        this.skipping = 4 + length - kept;
        this.drop(kept);
        continue;
      }
      if (this.buffered < 4 + length) break;
      const whole = Buffer.concat(this.chunks, this.buffered);
      frames.push(whole.subarray(4, 4 + length));
      this.drop(4 + length);
    }
    return frames;
  }

  private drop(n: number): void {
    const whole = Buffer.concat(this.chunks, this.buffered);
    const rest = whole.subarray(n);
    this.chunks = rest.length ? [rest] : [];
    this.buffered = rest.length;
  }

  private peek(n: number): Buffer {
    const first = this.chunks[0];
    if (first && first.length >= n) return first;
    const joined = Buffer.concat(this.chunks, this.buffered);
    this.chunks = [joined];
    return joined;
  }
}

/**
 * The request id of a reply from its first bytes: the agent begins every reply with its type
 * (`t`) and then its `id` (see reply_begin in agent/channel.c). Undefined when they say otherwise.
 */
export function replyIdOf(head: Buffer): number | undefined {
  let at = 0;
  const byte = (): number | undefined => (at < head.length ? head[at++] : undefined);
  const first = byte();
  if (first === undefined) return undefined;
  if (first === 0xde) at += 2;
  else if (first === 0xdf) at += 4;
  else if ((first & 0xf0) !== 0x80) return undefined;
  const str = (): string | undefined => {
    const b = byte();
    if (b === undefined) return undefined;
    const n = (b & 0xe0) === 0xa0 ? b & 0x1f : b === 0xd9 ? byte() : undefined;
    if (n === undefined || at + n > head.length) return undefined;
    at += n;
    return head.toString('utf8', at - n, at);
  };
  const uint = (): number | undefined => {
    const b = byte();
    if (b === undefined) return undefined;
    if (b < 0x80) return b;
    const size = { 0xcc: 1, 0xcd: 2, 0xce: 4 }[b];
    if (size === undefined || at + size > head.length) return undefined;
    at += size;
    return head.readUIntBE(at - size, size);
  };
  for (let i = 0; i < 2; i++) {
    const key = str();
    if (key === 'id') return uint();
    if (key !== 't' || str() === undefined) return undefined;
  }
  return undefined;
}

/** Prefixes an encoded message with its length. */
export function frame(body: Buffer): Buffer {
  const head = Buffer.allocUnsafe(4);
  head.writeUInt32BE(body.length, 0);
  return Buffer.concat([head, body]);
}
