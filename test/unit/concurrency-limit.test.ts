import { describe, expect, it } from 'vitest';
import { ConcurrencyLimit } from '../../src/common/index.ts';

describe('ConcurrencyLimit', () => {
  it('runs at most its limit at once, in order, and a failed task frees its turn', async () => {
    const limit = new ConcurrencyLimit(3);
    let running = 0;
    let most = 0;
    const started: number[] = [];
    const task = (i: number) => async () => {
      started.push(i);
      running++;
      most = Math.max(most, running);
      await new Promise((done) => setTimeout(done, 10));
      running--;
      if (i === 4) throw new Error('task 4 fails');
      return i;
    };
    const results = await Promise.allSettled(Array.from({ length: 10 }, (_, i) => limit.run(task(i))));
    expect(most).toBe(3);
    expect(started).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(results.filter((r) => r.status === 'rejected')).toHaveLength(1);
    expect(await limit.run(() => Promise.resolve('after'))).toBe('after');
  });

  it('starts a hurried task next, ahead of those queued before it', async () => {
    const limit = new ConcurrencyLimit(1);
    const started: string[] = [];
    let release: () => void = () => undefined;
    const blocker = limit.run(() => new Promise<void>((done) => (release = done)));
    const keys = ['a', 'b', 'c'].map((name) => ({ name }));
    const queued = keys.map((key) =>
      limit.run(() => {
        started.push(key.name);
        return Promise.resolve();
      }, key),
    );
    limit.hurry(keys[2]!);
    limit.hurry({ name: 'unknown' }); // nothing waits under it: no change
    release();
    await Promise.all([blocker, ...queued]);
    expect(started).toEqual(['c', 'a', 'b']);
  });
});
