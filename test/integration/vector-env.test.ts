import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SandboxEnv, VectorEnv, type SandboxAction, type SandboxObservation } from '../../src/env/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const RUN: SandboxAction = { type: 'exec', command: ['echo', 'step'] };
const SUBMIT: SandboxAction = { type: 'submit' };

describe('VectorEnv autoreset modes', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('vector');
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  const make = (): SandboxEnv =>
    SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
  const sandboxOf = (o: SandboxObservation | undefined): string | undefined =>
    o?.type === 'reset' ? o.sandboxId : undefined;

  it('next_step: the step after an episode ends ignores its action and resets that env only', async () => {
    await using vector = VectorEnv.create(make, 2, { autoreset: 'next_step' });
    const first = await vector.reset({ seed: 1 });
    const ended = await vector.step([SUBMIT, RUN]);
    expect(ended.terminated).toEqual([true, false]);
    const next = await vector.step([RUN, RUN]);
    expect(next.infos[0]?.['autoreset']).toBe(true);
    expect(next.observations[0]?.type).toBe('reset');
    expect(sandboxOf(next.observations[0])).not.toBe(sandboxOf(first.observations[0]));
    expect(next.observations[1]).toMatchObject({ type: 'exec', stdout: 'step\n' });
    expect(next.rewards[0]).toBe(0);
  });

  it('same_step: the ending step returns the next first observation and keeps the last in info', async () => {
    await using vector = VectorEnv.create(make, 2, { autoreset: 'same_step' });
    await vector.reset();
    const ended = await vector.step([SUBMIT, RUN]);
    expect(ended.terminated[0]).toBe(true);
    expect(ended.observations[0]?.type).toBe('reset');
    expect(ended.infos[0]?.['finalObservation']).toEqual({ type: 'submitted' });
    expect((await vector.step([RUN, RUN])).observations[0]).toMatchObject({ type: 'exec', stdout: 'step\n' });
  });

  it('disabled: an ended env refuses steps until a masked reset', async () => {
    await using vector = VectorEnv.create(make, 2, { autoreset: 'disabled' });
    await vector.reset();
    await vector.step([SUBMIT, RUN]);
    await expect(vector.step([RUN, RUN])).rejects.toThrow(/Environment 0 has ended; reset it/);
    const partial = await vector.reset({ options: { mask: [true, false] } });
    expect(partial.observations[1]).toBeUndefined();
    expect((await vector.step([RUN, RUN])).observations.map((o) => o?.type)).toEqual(['exec', 'exec']);
    await expect(vector.step([RUN])).rejects.toThrow(/one action per environment: 2, got 1/);
  });
});
