import { Packr } from 'msgpackr';

/** Encodes and decodes wire messages. Injected, so transports never depend on one format. */
export interface Codec {
  encode(value: unknown): Buffer;
  decode(bytes: Uint8Array): unknown;
}

/** A message larger than this leaves msgpackr's scratch buffer to itself (see createMsgpackCodec). */
const LARGE_MESSAGE_BYTES = 1024 * 1024;
const SCRATCH_BYTES = 8192;

/**
 * msgpack with plain maps (no record extension), so a peer in another language, or the C agent,
 * reads every message with an ordinary msgpack decoder.
 */
export function createMsgpackCodec(): Codec {
  const packr = new Packr({ useRecords: false, mapsAsObjects: true, int64AsType: 'number' });
  return {
    encode: (value) => {
      const bytes = packr.pack(value);
      // msgpackr packs into one scratch buffer, grown to the largest message so far and kept for
      // the process's life: after a large one, hand it a small one so the large goes with its message
      if (bytes.length > LARGE_MESSAGE_BYTES) packr.useBuffer(Buffer.allocUnsafeSlow(SCRATCH_BYTES));
      return bytes;
    },
    decode: (bytes): unknown => packr.unpack(bytes),
  };
}
