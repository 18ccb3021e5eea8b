import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SandboxEnv } from '../../src/env/index.ts';
import { openHandlesUnder } from '../support/open-handles.ts';
import { createTestPlatform } from '../support/platform.ts';

async function until(what: string, done: () => boolean): Promise<void> {
  for (let polls = 0; !done(); polls++) {
    if (polls > 400) throw new Error(`never happened: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe('trajectory logs', () => {
  it('are closed when their sandbox ends, kept for audit, and removed after the retention', async () => {
    await using test = await createTestPlatform('trajectory-retention', { trajectoryRetentionMs: 2_000 });
    const env = SandboxEnv.create(test.platform, {
      sandbox: { environment: 'busybox:latest', resources: { memoryMib: 64 } },
    });
    let log = '';
    try {
      const reset = await env.reset({ options: { episodeId: 'retention' } });
      await env.step({ type: 'exec', command: 'echo stepped' });
      log = join(test.dataDir, 'trajectories', `${reset.info.sandboxId}.log`);
      expect(openHandlesUnder(log)).toEqual([log]);
    } finally {
      await env.close();
    }
    // the sandbox is gone: its log is closed at once, and stays for `sandgym audit` a while
    await until('the ended sandbox’s log is closed', () => openHandlesUnder(log).length === 0);
    expect(existsSync(log)).toBe(true);
    await until('the log is removed after its retention', () => !existsSync(log));
  });
});
