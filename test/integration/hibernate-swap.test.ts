import { describe, expect, it } from 'vitest';
import { collectExec, ensureSwapFile, removeSwapFile } from '../../src/backends/index.ts';
import type { Sandbox } from '../../src/platform/index.ts';
import { createTestPlatform } from '../support/platform.ts';

/** A process holding `mb` MB of known content in anonymous memory until /tmp/check appears. */
async function holdPattern(sandbox: Sandbox, mb: number): Promise<{ verdict: Promise<string> }> {
  await sandbox.exec(['rm', '-f', '/tmp/check', '/tmp/holding']);
  const holder = collectExec(
    sandbox.execStream([
      'sh',
      '-c',
      [
        `p=$(yes sandgym-pattern | head -c ${mb * 1000000})`,
        'before=$(echo "$p" | md5sum)',
        'touch /tmp/holding',
        'while [ ! -e /tmp/check ]; do sleep 0.05; done',
        '[ "$(echo "$p" | md5sum)" = "$before" ] && echo intact || echo changed',
      ].join('; '),
    ]),
  ).then((r) => r.stdout);
  while ((await sandbox.exec(['test', '-e', '/tmp/holding'])).exitCode !== 0) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  // wrapped: an async function would otherwise wait for the holder itself
  return { verdict: holder };
}

describe('hibernation onto swap', () => {
  it('moves anonymous memory to swap and back intact, and reports a sandbox whose swap is gone as node_lost', async () => {
    await using test = await createTestPlatform('hibernate-swap');
    // beside the data dir, not in it: nothing but the platform's own folders belongs there
    const swapFile = `${test.dataDir}.swapfile`;
    await ensureSwapFile(swapFile, 96);
    try {
      await using sandbox = await test.platform.createSandbox({
        environment: 'busybox:latest',
        resources: { memoryMib: 256 },
      });
      const holder = await holdPattern(sandbox, 16);
      const report = await sandbox.hibernate();
      expect(report.swappedBytes).toBeGreaterThan(8 * 1024 * 1024);
      expect(report.freedBytes).toBeGreaterThan(8 * 1024 * 1024);
      await sandbox.writeFile('/tmp/check', ''); // any request resumes it
      expect(await holder.verdict).toBe('intact\n');

      const second = await holdPattern(sandbox, 16);
      second.verdict.catch(() => undefined); // it dies with the sandbox
      expect((await sandbox.hibernate()).swappedBytes).toBeGreaterThan(0);
      // the swap its memory went to goes away while it sleeps
      await removeSwapFile(swapFile);
      await expect(sandbox.exec(['true'])).rejects.toMatchObject({ code: 'node_lost' });
      expect(sandbox.failure).toBe('node_lost');
    } finally {
      await removeSwapFile(swapFile);
    }
  });
});
