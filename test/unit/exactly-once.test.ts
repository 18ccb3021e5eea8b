import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createMsgpackCodec, isSandgymError } from '../../src/common/index.ts';
import { TrajectoryLog, lookupStep } from '../../src/platform/index.ts';

describe('the exactly-once rule over a trajectory log', () => {
  let dir: string | undefined;

  afterEach(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function openLog(): Promise<{ log: TrajectoryLog; path: string }> {
    dir ??= await mkdtemp(join(tmpdir(), 'sandgym-log-'));
    const path = join(dir, 'sandbox.log');
    return { log: await TrajectoryLog.open(path, createMsgpackCodec()), path };
  }

  const record = (stepIndex: number, action: unknown, result: unknown) => ({
    episodeId: 'e',
    stepIndex,
    action,
    result,
    startedAt: new Date(0).toISOString(),
    durationMs: 1,
  });

  it('answers a logged step with its record, whatever the key order of the action', async () => {
    const { log } = await openLog();
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 0, action: {} })).toEqual({ kind: 'next' });
    log.recordIntent({
      episodeId: 'e',
      stepIndex: 0,
      action: { type: 'exec', command: ['a'] },
      startedAt: '',
    });
    await log.append(record(0, { type: 'exec', command: ['a'] }, 1));
    const found = lookupStep(log, { episodeId: 'e', stepIndex: 0, action: { command: ['a'], type: 'exec' } });
    expect(found).toMatchObject({ kind: 'logged', record: { result: 1 } });
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 1, action: {} })).toEqual({ kind: 'next' });
    await log.close();
  });

  it('refuses a different action at a logged index, and a step that skips ahead', async () => {
    const { log } = await openLog();
    await log.append(record(0, { n: 1 }, 'ok'));
    let diverged: unknown;
    try {
      lookupStep(log, { episodeId: 'e', stepIndex: 0, action: { n: 2 } });
    } catch (error) {
      diverged = error;
    }
    expect(isSandgymError(diverged, 'divergence')).toBe(true);
    expect(() => lookupStep(log, { episodeId: 'e', stepIndex: 5, action: {} })).toThrow(
      /skips ahead: the next step the log can take is 1/,
    );
    await log.close();
  });

  it('keeps a step that started without a record as started across a reopen', async () => {
    const first = await openLog();
    await first.log.append(record(0, { n: 0 }, 'done'));
    first.log.recordIntent({ episodeId: 'e', stepIndex: 1, action: { n: 1 }, startedAt: 'then' });
    await first.log.close();
    const { log } = await openLog();
    expect(log.records).toHaveLength(1);
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 1, action: { n: 1 } })).toMatchObject({
      kind: 'started',
      intent: { startedAt: 'then' },
    });
    // the intent names its action: another one at that index diverges
    expect(() => lookupStep(log, { episodeId: 'e', stepIndex: 1, action: { n: 9 } })).toThrow(/diverges/);
    // its record, once there, settles it
    await log.append(record(1, { n: 1 }, 'late'));
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 1, action: { n: 1 } })).toMatchObject({
      kind: 'logged',
    });
    await log.close();
  });
});
