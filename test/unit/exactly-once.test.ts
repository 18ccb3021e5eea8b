import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createMsgpackCodec, isSandgymError } from '../../src/common/index.ts';
import { ExactlyOnceSteps, TrajectoryLog, localStepLog } from '../../src/platform/index.ts';

describe('exactly-once steps', () => {
  let dir: string | undefined;

  afterEach(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function fixture(): Promise<{ log: TrajectoryLog; steps: ExactlyOnceSteps }> {
    dir = await mkdtemp(join(tmpdir(), 'sandgym-log-'));
    const log = await TrajectoryLog.open(join(dir, 'sandbox.log'), createMsgpackCodec());
    return { log, steps: new ExactlyOnceSteps(localStepLog(log)) };
  }

  it('runs a step once, then replays it whatever the key order of the action', async () => {
    const { log, steps } = await fixture();
    let runs = 0;
    const execute = (): Promise<number> => Promise.resolve(++runs);
    const first = await steps.run(
      { episodeId: 'e', stepIndex: 0, action: { type: 'exec', command: ['a', 'b'] } },
      execute,
    );
    const again = await steps.run(
      { episodeId: 'e', stepIndex: 0, action: { command: ['a', 'b'], type: 'exec' } },
      execute,
    );
    expect(first).toEqual({ result: 1, replayed: false });
    expect(again).toEqual({ result: 1, replayed: true });
    expect(runs).toBe(1);
    await log.close();
  });

  it('refuses a different action at a logged index, and a step that skips ahead', async () => {
    const { log, steps } = await fixture();
    await steps.run({ episodeId: 'e', stepIndex: 0, action: { n: 1 } }, () => Promise.resolve('ok'));
    const diverged: unknown = await steps
      .run({ episodeId: 'e', stepIndex: 0, action: { n: 2 } }, () => Promise.resolve('no'))
      .catch((e: unknown) => e);
    expect(isSandgymError(diverged, 'divergence')).toBe(true);
    await expect(
      steps.run({ episodeId: 'e', stepIndex: 5, action: {} }, () => Promise.resolve('')),
    ).rejects.toThrow(/skips ahead: the next step the log can take is 1/);
    await log.close();
  });
});
