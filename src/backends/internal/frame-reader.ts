import { SandgymError } from '../../common/index.ts';

/**
 * Splits a byte stream into length-prefixed frames (4-byte big-endian length). Chunks are joined
 * only when a frame is complete, so a large frame costs one copy, not one per chunk.
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;

  constructor(private readonly maxFrameBytes: number) {}

  /** Adds a chunk and returns every frame it completed. */
  push(chunk: Buffer): Buffer[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const frames: Buffer[] = [];
    for (;;) {
      if (this.buffered < 4) break;
      const head = this.peek(4);
      const length = head.readUInt32BE(0);
      if (length > this.maxFrameBytes) {
        throw new SandgymError(
          'agent_crash',
          `Agent sent a ${length}-byte frame, over the ${this.maxFrameBytes}-byte limit`,
        );
      }
      if (this.buffered < 4 + length) break;
      const whole = Buffer.concat(this.chunks, this.buffered);
      frames.push(whole.subarray(4, 4 + length));
      const rest = whole.subarray(4 + length);
      this.chunks = rest.length ? [rest] : [];
      this.buffered = rest.length;
    }
    return frames;
  }

  private peek(n: number): Buffer {
    const first = this.chunks[0];
    if (first && first.length >= n) return first;
    const joined = Buffer.concat(this.chunks, this.buffered);
    this.chunks = [joined];
    return joined;
  }
}

/** Prefixes an encoded message with its length. */
export function frame(body: Buffer): Buffer {
  const head = Buffer.allocUnsafe(4);
  head.writeUInt32BE(body.length, 0);
  return Buffer.concat([head, body]);
}
