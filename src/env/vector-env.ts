import { SandgymError, settleAll } from '../common/index.ts';
import type {
  EnvCallOptions,
  Environment,
  ResetInfo,
  ResetOptions,
  StepInfo,
  StepResult,
} from './environment.ts';

/**
 * When a sub-environment whose episode ended starts the next one, as in Gymnasium:
 * - `next_step`: on the following step() its action is ignored and it resets; that step reports
 *   the reset observation with reward 0;
 * - `same_step`: it resets within the step that ended the episode; the step reports the new
 *   episode's first observation, and the last one of the old episode is in `info.finalObservation`;
 * - `disabled`: it stays ended until reset() is called with it in `options.mask`.
 */
export type AutoresetMode = 'next_step' | 'same_step' | 'disabled';

/** Options for {@link VectorEnv.create}. */
export interface VectorEnvOptions {
  autoreset: AutoresetMode;
}

/** Step results of every sub-environment, index by index. */
export interface VectorStepResult<Observation> {
  observations: Observation[];
  rewards: number[];
  terminated: boolean[];
  truncated: boolean[];
  infos: StepInfo[];
  outcomes: StepResult<Observation>['outcome'][];
}

/** Several environments stepped together, each in its own sandbox; the autoreset mode is explicit. */
export class VectorEnv<Action, Observation> implements AsyncDisposable {
  private readonly ended: boolean[];

  private constructor(
    readonly envs: Environment<Action, Observation>[],
    readonly autoreset: AutoresetMode,
  ) {
    this.ended = envs.map(() => false);
  }

  /**
   * `count` envs stepped together, each made by `makeEnv(index)`.
   *
   * @example
   * ```ts
   * const vector = VectorEnv.create((i) => SandboxEnv.create(platform, { sandbox: {} }), 8, {
   *   autoreset: 'next_step',
   * });
   * await vector.reset();
   * const { observations, rewards } = await vector.step(actions);
   * ```
   */
  static create<A, O>(
    makeEnv: (index: number) => Environment<A, O>,
    count: number,
    options: VectorEnvOptions,
  ): VectorEnv<A, O> {
    if (!Number.isInteger(count) || count < 1)
      throw new SandgymError('invalid_argument', `A VectorEnv needs at least one environment, got ${count}`);
    return new VectorEnv(
      Array.from({ length: count }, (_, i) => makeEnv(i)),
      options.autoreset,
    );
  }

  /** Resets every sub-environment, or (with `options.mask`) only those whose mask entry is true. */
  async reset(
    options: ResetOptions = {},
  ): Promise<{ observations: (Observation | undefined)[]; infos: (ResetInfo | undefined)[] }> {
    const mask = options.options?.['mask'] as boolean[] | undefined;
    const results = await Promise.all(
      this.envs.map(async (env, i) => {
        if (mask && !mask[i]) return undefined;
        this.ended[i] = false;
        return env.reset({ ...options, ...(options.seed === undefined ? {} : { seed: options.seed + i }) });
      }),
    );
    return { observations: results.map((r) => r?.observation), infos: results.map((r) => r?.info) };
  }

  async step(actions: Action[], options: EnvCallOptions = {}): Promise<VectorStepResult<Observation>> {
    if (actions.length !== this.envs.length) {
      throw new SandgymError(
        'invalid_argument',
        `step() needs one action per environment: ${this.envs.length}, got ${actions.length}`,
      );
    }
    const results = await Promise.all(
      this.envs.map((env, i) => this.stepOne(env, i, actions[i] as Action, options)),
    );
    return {
      observations: results.map((r) => r.observation),
      rewards: results.map((r) => r.reward),
      terminated: results.map((r) => r.terminated),
      truncated: results.map((r) => r.truncated),
      infos: results.map((r) => r.info),
      outcomes: results.map((r) => r.outcome),
    };
  }

  private async stepOne(
    env: Environment<Action, Observation>,
    i: number,
    action: Action,
    options: EnvCallOptions,
  ): Promise<StepResult<Observation>> {
    if (this.ended[i]) {
      if (this.autoreset === 'disabled') {
        throw new SandgymError(
          'failed_precondition',
          `Environment ${i} has ended; reset it (options.mask) before stepping it again`,
        );
      }
      // next_step: this step's action is ignored; the environment starts its next episode
      this.ended[i] = false;
      const reset = await env.reset(options.signal ? { signal: options.signal } : {});
      return {
        observation: reset.observation,
        reward: 0,
        terminated: false,
        truncated: false,
        info: {
          episodeId: reset.info.episodeId,
          stepIndex: -1,
          replayed: false,
          autoreset: true,
          resetInfo: reset.info,
        },
        outcome: { kind: 'ok' },
      };
    }
    const result = await env.step(action, options);
    if (!(result.terminated || result.truncated)) return result;
    if (this.autoreset === 'same_step') {
      const reset = await env.reset(options.signal ? { signal: options.signal } : {});
      return {
        ...result,
        observation: reset.observation,
        info: {
          ...result.info,
          finalObservation: result.observation,
          finalInfo: result.info,
          autoreset: true,
        },
      };
    }
    this.ended[i] = true;
    return result;
  }

  async close(): Promise<void> {
    await settleAll(
      this.envs.map((env) => env.close()),
      'Some environments did not close cleanly',
    );
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
