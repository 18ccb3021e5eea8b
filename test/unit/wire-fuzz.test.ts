import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import {
  NODE,
  RUNS,
  SANDBOXES,
  decodeMessage,
  encodeMessage,
  type MethodDef,
  type ServiceDef,
} from '../../src/platform/wire/index.ts';

const SERVICES: ServiceDef[] = [SANDBOXES, RUNS, NODE];
const METHODS: [string, MethodDef][] = SERVICES.flatMap((service) => Object.entries(service.methods));

/** A decoder may accept a message or reject it with invalid_argument; anything else is a bug. */
function decodeSafely(method: MethodDef, bytes: Uint8Array): 'accepted' | 'rejected' {
  try {
    decodeMessage(method.request, bytes, method.maxRequestBytes ?? 1024 * 1024, 'fuzz');
    return 'accepted';
  } catch (error) {
    if (isSandgymError(error, 'invalid_argument')) return 'rejected';
    throw error;
  }
}

/** One well-formed request per method, to mutate. */
const VALID: Record<string, unknown> = {
  Create: { request: { environment: 'busybox:latest', resources: { memoryMib: 64 } } },
  Exec: { sandboxId: 'sg-n1-abcdefghijkl', argv: ['sh', '-c', 'echo hi'], timeoutMs: 1000 },
  ReadFile: { sandboxId: 'sg-n1-abcdefghijkl', path: '/etc/hosts' },
  WriteFile: { sandboxId: 'sg-n1-abcdefghijkl', path: '/tmp/x', data: Buffer.from('hi'), mode: 0o644 },
  Step: { sandboxId: 'sg-n1-abcdefghijkl', episodeId: 'e', stepIndex: 0, action: { type: 'submit' } },
};

describe('wire decoders under fuzz', () => {
  it('reject random bytes with invalid_argument, never a crash', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 512 }), fc.constantFrom(...METHODS), (bytes, [, method]) => {
        decodeSafely(method, bytes);
      }),
      { numRuns: 5000 },
    );
  });

  it('reject random msgpack values unless they are valid requests', () => {
    fc.assert(
      fc.property(fc.anything({ maxDepth: 4 }), fc.constantFrom(...METHODS), (value, [, method]) => {
        let bytes: Uint8Array;
        try {
          bytes = encodeMessage(value);
        } catch {
          return; // a value msgpack cannot hold (e.g. a symbol) never reaches the wire
        }
        decodeSafely(method, bytes);
      }),
      { numRuns: 3000 },
    );
  });

  it('survive byte flips, truncations and extensions of valid requests', () => {
    const originals = Object.entries(VALID).map(([name, request]) => {
      const method = (SANDBOXES.methods as Record<string, MethodDef>)[name] as MethodDef;
      const bytes = encodeMessage(request);
      expect(decodeSafely(method, bytes), `${name} sample should be valid`).toBe('accepted');
      return { method, bytes };
    });
    fc.assert(
      fc.property(
        fc.constantFrom(...originals),
        fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 8 }),
        fc.nat(),
        fc.uint8Array({ maxLength: 16 }),
        ({ method, bytes }, flips, cut, tail) => {
          const mutated = Buffer.from(bytes);
          for (const [at, value] of flips) mutated[at % mutated.length] = value;
          const truncated = mutated.subarray(0, cut % (mutated.length + 1));
          decodeSafely(method, mutated);
          decodeSafely(method, truncated);
          decodeSafely(method, Buffer.concat([mutated, tail]));
        },
      ),
      { numRuns: 3000 },
    );
  });

  it('names an unknown field, and refuses an oversized message before decoding it', () => {
    const create = SANDBOXES.methods.Create;
    expect(() =>
      decodeMessage(create.request, encodeMessage({ request: {}, extra: 1 }), 1024, 'request'),
    ).toThrow(/extra/);
    expect(() => decodeMessage(create.request, Buffer.alloc(2048), 1024, 'request')).toThrow(
      /2048 bytes is more than the 1024/,
    );
  });
});
