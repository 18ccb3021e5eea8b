import type { EnvCallOptions, Environment, ResetOptions, ResetResult, StepResult } from './environment.ts';

/** Wraps an environment so that an episode is truncated after `maxSteps` steps. */
export function withStepLimit<A, O>(inner: Environment<A, O>, maxSteps: number): Environment<A, O> {
  let taken = 0;
  return {
    async reset(options?: ResetOptions): Promise<ResetResult<O>> {
      taken = 0;
      return inner.reset(options);
    },
    async step(action: A, options?: EnvCallOptions): Promise<StepResult<O>> {
      const result = await inner.step(action, options);
      taken++;
      return taken >= maxSteps && !result.terminated
        ? { ...result, truncated: true, info: { ...result.info, truncatedBy: 'step_limit' } }
        : result;
    },
    close: () => inner.close(),
    [Symbol.asyncDispose]: () => inner.close(),
  };
}
