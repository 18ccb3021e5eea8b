import { access } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { createMsgpackCodec } from '../../src/common/index.ts';
import { TrajectoryLog } from '../../src/platform/index.ts';
import { createTestPlatform } from '../support/platform.ts';

/** The platform's barrier before a sandbox's state outlives the host (see TrajectoryLog). */
describe("a sandbox's trajectory log synced at a barrier", () => {
  it('syncs a log a node process before this one wrote and never synced', async () => {
    await using test = await createTestPlatform('trajectory-sync');
    await using sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    const path = join(test.dataDir, 'trajectories', `${sandbox.id}.log`);
    // what a process that died left: written, not synced, and not open in this process
    const before = await TrajectoryLog.open(path, createMsgpackCodec());
    before.recordIntent({ episodeId: 'e', stepIndex: 0, action: { type: 'submit' }, startedAt: 'then' });
    await before.close();
    await test.platform.syncTrajectory(sandbox.id);
    const log = await test.platform.trajectory(sandbox.id);
    expect(log.intent('e', 0)).toMatchObject({ startedAt: 'then' });
    expect(log.room.usedBytes).toBeGreaterThan(0);
    expect(log.durableBytes).toBe(log.room.usedBytes);
  });

  it('makes no log for a sandbox that never stepped', async () => {
    await using test = await createTestPlatform('trajectory-sync-none');
    await using sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    await test.platform.syncTrajectory(sandbox.id);
    await expect(access(join(test.dataDir, 'trajectories', `${sandbox.id}.log`))).rejects.toThrow(/ENOENT/);
  });
});
