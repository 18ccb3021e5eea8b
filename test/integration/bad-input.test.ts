import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import type { Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

async function failure(promise: Promise<unknown>): Promise<{ code: string; message: string }> {
  const error: unknown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  if (!isSandgymError(error)) throw new Error(`expected a SandgymError, got ${String(error)}`);
  return { code: error.code, message: error.message };
}

describe('bad input gets a typed error and wedges nothing', () => {
  let env: TestPlatform;
  let sandbox: Sandbox;

  beforeAll(async () => {
    env = await createTestPlatform('bad-input');
    sandbox = await env.platform.createSandbox({ environment: 'busybox:latest' });
  });

  afterAll(async () => {
    try {
      await sandbox?.close();
    } finally {
      await env?.[Symbol.asyncDispose]();
    }
  });

  it('names an unknown environment and the known ones', async () => {
    const error = await failure(env.platform.createSandbox({ environment: 'nosuch:1' }));
    expect(error.code).toBe('not_found');
    expect(error.message).toMatch(/Unknown environment "nosuch:1"; known: .*busybox:latest/);
  });

  it('rejects a malformed environment reference', async () => {
    const error = await failure(env.platform.createSandbox({ environment: 'Bad Name' }));
    expect(error).toMatchObject({ code: 'invalid_argument' });
    expect(error.message).toMatch(/name:version/);
  });

  it('rejects a memory limit below the floor, naming the field', async () => {
    const error = await failure(
      env.platform.createSandbox({ environment: 'busybox:latest', resources: { memoryMib: 4 } }),
    );
    expect(error.code).toBe('invalid_argument');
    expect(error.message).toMatch(/resources\.memoryMib: memoryMib must be at least 16/);
  });

  it('rejects an empty command', async () => {
    expect(await failure(sandbox.exec([]))).toMatchObject({
      code: 'invalid_argument',
      message: (expect.stringMatching as (re: RegExp) => string)(/Command is empty/),
    });
    expect((await failure(sandbox.exec(['']))).code).toBe('invalid_argument');
  });

  it('rejects ".." in file paths on both calls', async () => {
    for (const call of [sandbox.readFile('/tmp/../etc/passwd'), sandbox.writeFile('/tmp/../../x', 'y')]) {
      expect(await failure(call)).toMatchObject({
        code: 'invalid_argument',
        message: (expect.stringMatching as (re: RegExp) => string)(/".."/),
      });
    }
  });

  it('ends a command at its timeout and keeps serving', async () => {
    const result = await sandbox.exec(['sleep', '60'], { timeoutMs: 200 });
    expect(result).toMatchObject({ timedOut: true, signal: 'SIGKILL', exitCode: null });
    expect((await sandbox.exec(['echo', 'ok'])).stdout).toBe('ok\n');
  });

  it('truncates a command that prints 1 GB, and keeps serving', async () => {
    const result = await sandbox.exec(['sh', '-c', 'head -c 1073741824 /dev/zero; echo done >&2'], {
      timeoutMs: 120_000,
    });
    expect(result.exitCode).toBe(0);
    expect(result.stdoutTruncated).toBe(true);
    expect(result.stdoutBytes).toBe(1073741824);
    expect(result.stdout.length).toBe(1024 * 1024);
    expect(result.stderr).toBe('done\n');
    expect((await sandbox.exec(['echo', 'ok'])).stdout).toBe('ok\n');
  });

  it('refuses a file larger than the read limit', async () => {
    await sandbox.exec(['sh', '-c', 'head -c 5000 /dev/zero > /tmp/big']);
    const error = await failure(sandbox.readFile('/tmp/big', { maxBytes: 1000 }));
    expect(error).toMatchObject({
      code: 'resource_exhausted',
      message: (expect.stringMatching as (re: RegExp) => string)(/1000-byte read limit/),
    });
  });

  it('refuses calls on a closed platform', async () => {
    const other = await createTestPlatform('closed');
    await other[Symbol.asyncDispose]();
    expect((await failure(other.platform.createSandbox({ environment: 'busybox:latest' }))).code).toBe(
      'failed_precondition',
    );
  });
});
