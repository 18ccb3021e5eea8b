import { TestScheduler } from 'rxjs/testing';
import { describe, expect, it } from 'vitest';
import type { RunStatus } from '../../src/platform/index.ts';
import { leaseRenewals, type LeaseEvent } from '../../src/rollout/index.ts';

const STATUS: RunStatus = { name: 'r', phase: 'rollout', lapsed: false, sandboxes: 2 };
const ok: LeaseEvent = { ok: true, status: STATUS };

function virtualTime(): TestScheduler {
  return new TestScheduler((actual, expected) => expect(actual).toEqual(expected));
}

describe('lease renewals in virtual time', () => {
  it('renews every period and reports each answer when it arrives', () => {
    const clock = virtualTime();
    clock.run(({ cold, expectObservable }) => {
      // the period is 10 ms and each answer takes 3 ms
      const renewals = leaseRenewals(() => cold('---(s|)', { s: STATUS }), 10, clock);
      expectObservable(renewals, '^ 45ms !').toBe('13ms a 9ms b 9ms c 9ms d', { a: ok, b: ok, c: ok, d: ok });
    });
  });

  it('reports a failed renewal and tries again on the next tick', () => {
    const clock = virtualTime();
    let calls = 0;
    clock.run(({ cold, expectObservable }) => {
      const renewals = leaseRenewals(
        () => (++calls === 2 ? cold('-#', {}, new Error('node unreachable')) : cold('-(s|)', { s: STATUS })),
        10,
        clock,
      );
      expectObservable(renewals, '^ 35ms !').toBe('11ms a 9ms b 9ms c', {
        a: ok,
        b: { ok: false, error: 'node unreachable' },
        c: ok,
      });
    });
  });

  it('never stacks renewals onto a slow one: ticks that fall while one is in flight are skipped', () => {
    const clock = virtualTime();
    let calls = 0;
    clock.run(({ cold, expectObservable }) => {
      // answers take 25 ms and the period is 10 ms: renewals start at 10, 40 and 70 only
      const renewals = leaseRenewals(
        () => {
          calls++;
          return cold('25ms (s|)', { s: STATUS });
        },
        10,
        clock,
      );
      expectObservable(renewals, '^ 97ms !').toBe('35ms a 29ms b 29ms c', { a: ok, b: ok, c: ok });
    });
    expect(calls).toBe(3);
  });
});
