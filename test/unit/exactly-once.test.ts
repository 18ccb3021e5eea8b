import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
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
    log.append(record(0, { type: 'exec', command: ['a'] }, 1));
    const found = lookupStep(log, { episodeId: 'e', stepIndex: 0, action: { command: ['a'], type: 'exec' } });
    expect(found).toMatchObject({ kind: 'logged', record: { result: 1 } });
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 1, action: {} })).toEqual({ kind: 'next' });
    await log.close();
  });

  it('refuses a different action at a logged index, and a step that skips ahead', async () => {
    const { log } = await openLog();
    log.append(record(0, { n: 1 }, 'ok'));
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
    first.log.append(record(0, { n: 0 }, 'done'));
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
    log.append(record(1, { n: 1 }, 'late'));
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 1, action: { n: 1 } })).toMatchObject({
      kind: 'logged',
    });
    await log.close();
  });

  /**
   * Runs a node process (built code) that opens the log at `path`, starts step 0 and, unless
   * `recordIt` is false, records it; then it is SIGKILLed at once, as a node process dies right
   * after answering. No close, no sync: what it leaves is what the page cache holds.
   */
  function dieAfterStep(path: string, recordIt: boolean): void {
    const child = spawnSync(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `
const { TrajectoryLog } = await import(${JSON.stringify(resolve('dist/src/platform/index.js'))});
const { createMsgpackCodec } = await import(${JSON.stringify(resolve('dist/src/common/index.js'))});
const log = await TrajectoryLog.open(process.env.LOG, createMsgpackCodec());
const step = { episodeId: 'e', stepIndex: 0, action: { type: 'exec', command: ['rm', '-rf', '/data'] } };
log.recordIntent({ ...step, startedAt: 'then' });
if (process.env.RECORD === '1') log.append({ ...step, result: 'answered', startedAt: 'then', durationMs: 1 });
process.kill(process.pid, 'SIGKILL');
`,
      ],
      { env: { ...process.env, LOG: path, RECORD: recordIt ? '1' : '0' }, encoding: 'utf8' },
    );
    expect(child.signal, child.stderr).toBe('SIGKILL');
  }

  it('keeps an answered step that its process died right after: a retry gets the record, never a rerun', async () => {
    const { path } = await openLog();
    dieAfterStep(path, true);
    const log = await TrajectoryLog.open(path, createMsgpackCodec());
    const action = { type: 'exec', command: ['rm', '-rf', '/data'] };
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 0, action })).toMatchObject({
      kind: 'logged',
      record: { result: 'answered' },
    });
    await log.close();
  });

  it('keeps a step its process died in before recording it as in doubt, not as one to run', async () => {
    const { path } = await openLog();
    dieAfterStep(path, false);
    const log = await TrajectoryLog.open(path, createMsgpackCodec());
    const action = { type: 'exec', command: ['rm', '-rf', '/data'] };
    expect(lookupStep(log, { episodeId: 'e', stepIndex: 0, action })).toMatchObject({ kind: 'started' });
    await log.close();
  });

  it('syncs at a barrier what was written before it, shared by concurrent callers', async () => {
    const { log, path } = await openLog();
    log.append(record(0, { n: 0 }, 'a'));
    expect(log.durableBytes).toBe(0);
    await Promise.all([log.sync(), log.sync()]);
    expect(log.durableBytes).toBe(log.room.usedBytes);
    log.recordIntent({ episodeId: 'e', stepIndex: 1, action: { n: 1 }, startedAt: '' });
    // one that comes while a sync is under way waits for one that covers what it wrote too
    const first = log.sync();
    log.append(record(1, { n: 1 }, 'b'));
    await Promise.all([first, log.sync()]);
    expect(log.durableBytes).toBe(log.room.usedBytes);
    await log.close();
    // a log opened again knows nothing of what a process before it synced: its barrier syncs it all
    const again = await TrajectoryLog.open(path, createMsgpackCodec());
    expect(again.durableBytes).toBe(0);
    await again.sync();
    expect(again.durableBytes).toBe(again.room.usedBytes);
    await again.close();
  });

  it('fails every barrier after a failed sync, naming the log and what to check', async () => {
    const { log } = await openLog();
    log.append(record(0, { n: 0 }, 'a'));
    await log.close(); // its descriptor gone: the sync fails as a disk's error would
    await expect(log.sync()).rejects.toThrow(/Cannot sync the trajectory log .*sandbox\.log.*check the disk/);
    await expect(log.sync()).rejects.toThrow(/Cannot sync the trajectory log/);
  });
});
