import type { z } from 'zod';
import { SandgymError, createMsgpackCodec, messageOf, parseAt } from '../../common/index.ts';

const codec = createMsgpackCodec();

/** Encodes a message for the wire. */
export function encodeMessage(value: unknown): Buffer {
  return codec.encode(value);
}

/**
 * Decodes and validates one message from the wire. Anything wrong (too big, not msgpack, a field
 * missing, mistyped or unknown) is an `invalid_argument` that names the field, never a crash.
 */
export function decodeMessage<S extends z.ZodType>(
  schema: S,
  bytes: Uint8Array,
  maxBytes: number,
  where: string,
): z.output<S> {
  if (bytes.byteLength > maxBytes) {
    throw new SandgymError(
      'invalid_argument',
      `Invalid ${where}: ${bytes.byteLength} bytes is more than the ${maxBytes} this method accepts`,
    );
  }
  let value: unknown;
  try {
    value = codec.decode(bytes);
  } catch (error) {
    throw new SandgymError(
      'invalid_argument',
      `Invalid ${where}: not a msgpack message (${messageOf(error)})`,
    );
  }
  return parseAt(schema, value, where);
}
