import { Client, Metadata, credentials, status, type ServiceError } from '@grpc/grpc-js';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/common/index.ts';
import { NodeAgent, Platform, type RemotePlatform } from '../../src/platform/index.ts';
import { SANDBOXES, WireClient, methodPath } from '../../src/platform/wire/index.ts';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const TOKEN = 'wire-test-token-8c2e4a6f1b3d5079e1a3';

describe('wire protocol against a real node agent', () => {
  let test: TestPlatform;
  let node: NodeAgent;
  let address: string;

  beforeAll(async () => {
    test = await createTestPlatform('wire');
    node = await NodeAgent.start(test.platform, {
      listen: '127.0.0.1:0',
      token: TOKEN,
      logger: silentLogger(),
    });
    address = `127.0.0.1:${node.port}`;
  });

  afterAll(async () => {
    try {
      await node?.close();
    } finally {
      await test?.[Symbol.asyncDispose]();
    }
  });

  /** Sends raw bytes to a method, as a client in another language (or an attacker) could. */
  function sendRaw(
    client: Client,
    method: string,
    bytes: Buffer,
    token = TOKEN,
  ): Promise<ServiceError | null> {
    const metadata = new Metadata();
    metadata.set('authorization', `Bearer ${token}`);
    return new Promise((resolve) =>
      client.makeUnaryRequest(
        methodPath(SANDBOXES, method),
        (b: Buffer) => b,
        (b: Buffer) => b,
        bytes,
        metadata,
        (error) => resolve(error),
      ),
    );
  }

  it('answers a missing or wrong token with UNAUTHENTICATED', async () => {
    const none = new WireClient(address, SANDBOXES, {});
    const wrong = new WireClient(address, SANDBOXES, { token: 'nope' });
    try {
      await expectCode(none.call('List', {}), 'unauthenticated', /no token/);
      await expectCode(wrong.call('List', {}), 'unauthenticated', /not valid/);
    } finally {
      none.close();
      wrong.close();
    }
  });

  it('rejects malformed and unknown-field requests with INVALID_ARGUMENT, oversized ones unread, and keeps serving', async () => {
    const raw = new Client(address, credentials.createInsecure(), {
      'grpc.max_send_message_length': 128 * 1024 * 1024,
    });
    const client = new WireClient(address, SANDBOXES, { token: TOKEN });
    try {
      await expectCode(
        client.call('Create', { request: {}, surprise: true }),
        'invalid_argument',
        /surprise/,
      );
      await expectCode(
        client.call('Create', { request: { resources: { memoryMib: 'lots' } } }),
        'invalid_argument',
        /resources\.memoryMib/,
      );
      // refused from its length prefix by the method's cap, before the body is buffered
      const huge = await sendRaw(raw, 'List', Buffer.alloc(2 * 1024 * 1024));
      expect(huge?.code).toBe(status.RESOURCE_EXHAUSTED);
      expect(huge?.details).toMatch(/larger than max \(2097152 vs 1048576\)/);
      const methods = Object.keys(SANDBOXES.methods);
      await fc.assert(
        fc.asyncProperty(
          fc.uint8Array({ maxLength: 256 }),
          fc.constantFrom(...methods),
          async (bytes, method) => {
            const error = await sendRaw(raw, method, Buffer.from(bytes));
            // an empty message may be a valid request to a method without fields
            if (error) expect([status.INVALID_ARGUMENT, status.NOT_FOUND]).toContain(error.code);
          },
        ),
        { numRuns: 300 },
      );
      expect((await client.call('List', {})).sandboxes).toEqual([]);
    } finally {
      raw.close();
      client.close();
    }
  });

  it('cancels a running command when the call deadline passes', async () => {
    const platform: RemotePlatform = await Platform.connect(`grpc://${address}`, { token: TOKEN });
    const client = new WireClient(address, SANDBOXES, { token: TOKEN });
    try {
      const sandbox = await platform.createSandbox({
        environment: 'busybox:latest',
        resources: { memoryMib: 64 },
      });
      // a client learns the layers by digest, never where the node keeps them
      expect(sandbox.layers.length).toBeGreaterThan(0);
      for (const layer of sandbox.layers) expect(Object.keys(layer).sort()).toEqual(['digest', 'sizeBytes']);
      const events = client.stream(
        'Exec',
        { sandboxId: sandbox.id, argv: ['sleep', '30'] },
        { timeoutMs: 500 },
      );
      await expectCode(
        (async () => {
          for await (const event of events) void event;
        })(),
        'timeout',
      );
      // the deadline reached the sandbox: the command is gone, not left running
      let left = '';
      for (let attempt = 0; attempt < 50; attempt++) {
        left = (await sandbox.exec(['sh', '-c', 'ps -o comm | grep -c "^sleep" || true'])).stdout.trim();
        if (left === '0') break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(left).toBe('0');
    } finally {
      client.close();
      await platform.close();
    }
  });
});
