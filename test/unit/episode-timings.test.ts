import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { PhaseClock } from '../../src/env/episode-timings.ts';
import { EPISODE_PHASES, overheadMs } from '../../src/env/index.ts';

describe('episode timings', () => {
  it('counts time to the innermost phase, so phases add up to the whole', async () => {
    const clock = new PhaseClock();
    const started = performance.now();
    await clock.time('graderStaging', async () => {
      await sleep(20);
      await clock.time('tests', () => sleep(40));
      await sleep(20);
    });
    const whole = performance.now() - started;
    const { graderStaging = 0, tests = 0 } = clock.snapshot();
    expect(tests).toBeGreaterThanOrEqual(39);
    expect(graderStaging).toBeGreaterThanOrEqual(39);
    // the outer phase left out the inner one's time: together they are the wall time
    expect(graderStaging + tests).toBeLessThanOrEqual(whole + 1);
    expect(graderStaging).toBeLessThan(whole - tests + 1);
  });

  it('keeps concurrent phases apart: one never takes another’s time as its inner', async () => {
    const clock = new PhaseClock();
    await Promise.all([
      clock.time('diff', () => sleep(30)),
      clock.time('inspect', async () => {
        await sleep(5);
        await clock.time('network', () => sleep(10));
      }),
    ]);
    const { diff = 0, network = 0 } = clock.snapshot();
    // the diff ran beside the others, not around them: its time is its own, whole
    expect(diff).toBeGreaterThanOrEqual(29);
    expect(network).toBeGreaterThanOrEqual(9);
  });

  it('moves a command’s own time out of its step, never below zero', async () => {
    const clock = new PhaseClock();
    await clock.time('step', () => sleep(20));
    clock.move('step', 'command', 15);
    clock.move('step', 'command', 1000);
    const { step = 0, command = 0 } = clock.snapshot();
    expect(step).toBe(0);
    expect(command).toBeGreaterThanOrEqual(19);
  });

  it("counts as overhead every phase but the task's and the agent's own", () => {
    const all = Object.fromEntries(EPISODE_PHASES.map((phase) => [phase, 1]));
    expect(overheadMs(all)).toBe(EPISODE_PHASES.length - 4);
    expect(overheadMs({ agent: 100, command: 50, tests: 10, taskStartup: 5 })).toBe(0);
    expect(overheadMs({ create: 3, diff: 4, tests: 100 })).toBe(7);
  });
});
