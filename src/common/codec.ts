import { Packr } from 'msgpackr';

/** Encodes and decodes wire messages. Injected, so transports never depend on one format. */
export interface Codec {
  encode(value: unknown): Buffer;
  decode(bytes: Uint8Array): unknown;
}

/**
 * msgpack with plain maps (no record extension), so a peer in another language, or the C agent,
 * reads every message with an ordinary msgpack decoder.
 */
export function createMsgpackCodec(): Codec {
  const packr = new Packr({ useRecords: false, mapsAsObjects: true, int64AsType: 'number' });
  return {
    encode: (value) => packr.pack(value),
    decode: (bytes): unknown => packr.unpack(bytes),
  };
}
