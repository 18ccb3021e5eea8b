import { describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { RequestBudget } from '../../src/platform/wire/request-budget.ts';
import { SendWindow } from '../../src/platform/wire/send-window.ts';

const MIB = 2 ** 20;

describe('RequestBudget', () => {
  it('holds each project to its own budget and all of them to the total, each give-back once', () => {
    const budget = new RequestBudget({
      perProjectBytes: (project) => (project === 'big' ? 200 * MIB : 100 * MIB),
      totalBytes: 250 * MIB,
      raiseWith: 'the knob',
    });
    const first = budget.take('small', 64 * MIB);
    expect(() => budget.take('small', 64 * MIB)).toThrow(
      /Project small has 64 MiB .* budget is 100 MiB.*the knob/,
    );
    const refusal: unknown = (() => {
      try {
        budget.take('small', 64 * MIB);
      } catch (error) {
        return error;
      }
    })();
    expect(isSandgymError(refusal, 'resource_exhausted') && refusal.retryable).toBe(true);
    // another project's budget is its own, within the total
    const other = budget.take('big', 150 * MIB);
    expect(() => budget.take('big', 40 * MIB)).toThrow(
      /holds 214 MiB .* for all projects, its limit is 250 MiB/,
    );
    first();
    first();
    expect(budget.heldBy('small')).toBe(0);
    budget.take('small', 64 * MIB);
    other();
    expect(budget.heldBy('big')).toBe(0);
  });
});

describe('SendWindow', () => {
  it('lets calls go in order while they fit, one larger than the window alone, and drops a cancelled one', async () => {
    const window = new SendWindow(100);
    const order: string[] = [];
    const a = await window.take(60);
    const b = window.take(60).then((give) => (order.push('b'), give));
    const cancel = new AbortController();
    const c = window.take(30, cancel.signal).then(
      () => order.push('c'),
      () => order.push('c cancelled'),
    );
    const d = window.take(500).then((give) => (order.push('d'), give));
    cancel.abort();
    await c;
    a();
    const giveB = await b;
    expect(order).toEqual(['c cancelled', 'b']);
    giveB();
    (await d)();
    expect(order).toEqual(['c cancelled', 'b', 'd']);
    (await window.take(100))();
  });
});
