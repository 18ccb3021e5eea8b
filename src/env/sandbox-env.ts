import { randomBytes } from 'node:crypto';
import { SandgymError, faultPoint, isSandgymError, messageOf } from '../common/index.ts';
import {
  stepActionOf,
  type PlatformClient,
  type Sandbox,
  type SandboxAction,
  type SandboxObservation,
  type SandboxRequest,
  type StepOptions,
} from '../platform/index.ts';
import type {
  EnvCallOptions,
  Environment,
  ResetInfo,
  ResetOptions,
  ResetResult,
  StepInfo,
  StepResult,
} from './environment.ts';

/**
 * Where a checkpoint's state is kept, and where the episode was. `memory`: the sandbox's
 * processes, memory and files, on its node, restored in place (microVMs, VMs, containers with
 * CRIU); `disk`: its files, as an environment in the store, restored as a new sandbox.
 */
export type CheckpointRef = DiskCheckpointRef | MemoryCheckpointRef;

interface CheckpointPlace {
  /** The environment: the checkpoint's own (disk), or the one the sandbox started from (memory). */
  environment: string;
  episodeId: string;
  stepIndex: number;
}

/** A checkpoint of files: an environment any sandbox can start from. */
export interface DiskCheckpointRef extends CheckpointPlace {
  depth: 'disk';
}

/** A checkpoint of processes, memory and files, kept on the sandbox's node while it lives. */
export interface MemoryCheckpointRef extends CheckpointPlace {
  depth: 'memory';
  sandboxId: string;
  checkpointId: string;
}

/** What a restore says: a reset's info, and the checkpoint it started from. */
export interface RestoredInfo extends ResetInfo {
  restoredFrom: CheckpointRef;
}

/** Options for {@link SandboxEnv.create}. */
export interface SandboxEnvOptions {
  /** The sandbox each reset starts; its `environment` names the layer stack. */
  sandbox?: SandboxRequest;
  /** Absolute paths whose changes each step reports in `info.signals.protectedChanges`. */
  protectedPaths?: readonly string[];
  /**
   * Who every action runs as ("name", "uid", "name:group", "uid:gid"): its commands, and its file
   * reads, writes and listings, with exactly that user's rights and groups.
   * @default the USER of the sandbox's environment (root when it names none), as Docker's
   */
  user?: string;
}

/**
 * The label a sandbox made by an env with a user carries: who its agent acts as (a caller's own
 * label, not a reserved one: it only says who an env that attaches and names no user acts as).
 */
const AGENT_USER_LABEL = 'agent-user';

/**
 * A gym environment over one sandbox: each reset starts a fresh sandbox, each step is an action
 * in it, run by the platform where the sandbox runs and recorded in its trajectory log exactly
 * once: a client that crashed and retries, or another client that attaches, fast-forwards over
 * what already ran.
 */
export class SandboxEnv implements Environment<SandboxAction, SandboxObservation> {
  private sandbox: Sandbox | undefined;
  private owned = false;
  private episodeId = '';
  private stepIndex = 0;
  private isClosed = false;
  private checkpoints = 0;
  /** The USER of each environment its sandboxes came from, looked up once. */
  private readonly environmentUsers = new Map<string, Promise<string>>();

  private constructor(
    private readonly platform: PlatformClient,
    private readonly options: SandboxEnvOptions,
  ) {}

  /**
   * An env whose every episode runs in a sandbox made from `options.sandbox` (or steps the one
   * given by id). Nothing starts until {@link reset}.
   *
   * @example
   * ```ts
   * const env = SandboxEnv.create(platform, { sandbox: { environment: 'debian:bookworm' } });
   * await env.reset();
   * const { observation, info } = await env.step({ type: 'exec', command: 'python3 -V' });
   * await env.close();
   * ```
   */
  static create(platform: PlatformClient, options: SandboxEnvOptions = {}): SandboxEnv {
    return new SandboxEnv(platform, options);
  }

  /**
   * Attaches to a live sandbox and an episode another client started; its next steps (from
   * `nextStepIndex`, default 0) replay from the log until they reach the tail. The attached env
   * destroys the sandbox on close only when told it now `owned` it (the client that started it
   * is gone); its `sandbox` request, if given, is what its later resets start.
   */
  static attach(
    platform: PlatformClient,
    sandbox: Sandbox,
    episodeId: string,
    options: SandboxEnvOptions & { owned?: boolean; nextStepIndex?: number } = {},
  ): Promise<SandboxEnv> {
    const { owned, nextStepIndex, ...envOptions } = options;
    const env = new SandboxEnv(platform, envOptions);
    env.sandbox = sandbox;
    env.owned = owned ?? false;
    env.episodeId = episodeId;
    env.stepIndex = nextStepIndex ?? 0;
    return Promise.resolve(env);
  }

  /** The live sandbox, once reset. */
  get current(): Sandbox | undefined {
    return this.sandbox;
  }

  get episode(): string {
    return this.episodeId;
  }

  /** The index the next step will have. */
  get nextStepIndex(): number {
    return this.stepIndex;
  }

  async reset(options: ResetOptions = {}): Promise<ResetResult<SandboxObservation, ResetInfo>> {
    if (this.isClosed)
      throw new SandgymError('failed_precondition', 'Cannot reset: the environment is closed');
    await this.releaseSandbox();
    const request = this.options.sandbox ?? {};
    const user = this.options.user;
    const sandbox = await this.platform.createSandbox(
      // the user goes with the sandbox: whoever attaches to it later acts as that user too
      user === undefined ? request : { ...request, labels: { ...request.labels, [AGENT_USER_LABEL]: user } },
      options.signal ? { signal: options.signal } : {},
    );
    this.sandbox = sandbox;
    this.owned = true;
    const given = options.options?.['episodeId'];
    this.episodeId = typeof given === 'string' ? given : randomBytes(8).toString('hex');
    this.stepIndex = 0;
    const environment = sandbox.labels['environment'] ?? '';
    return {
      observation: { type: 'reset', sandboxId: sandbox.id, environment },
      info: { episodeId: this.episodeId, sandboxId: sandbox.id, seed: options.seed ?? null },
    };
  }

  /**
   * One step, in one call to the platform, which runs, audits and records it where the sandbox
   * runs (see PlatformClient.step). A step already recorded (this client retrying, or another
   * client that attached) answers with its record and `info.replayed`. Whatever a policy gives
   * that is not a valid action is a step too: logged, observed as an `invalid_action` error, and
   * the episode goes on (see stepActionOf).
   */
  async step(action: SandboxAction, options: EnvCallOptions = {}): Promise<StepResult<SandboxObservation>> {
    const checked = stepActionOf(action);
    const sandbox = this.sandbox;
    if (!sandbox) throw new SandgymError('failed_precondition', 'Call reset() before step()');
    const stepIndex = this.stepIndex;
    const stepOptions: StepOptions = {
      user: await this.userOf(sandbox),
      ...(this.options.protectedPaths?.length ? { protectedPaths: this.options.protectedPaths } : {}),
      ...(options.commandTimeoutCapMs === undefined
        ? {}
        : { commandTimeoutCapMs: options.commandTimeoutCapMs }),
    };
    let reply;
    faultPoint('env.before-step');
    try {
      reply = await this.platform.step(
        sandbox,
        { episodeId: this.episodeId, stepIndex, action: checked, options: stepOptions },
        options.signal ? { signal: options.signal } : {},
      );
    } catch (error) {
      if (!isSandgymError(error, 'node_lost')) throw error;
      // the node that runs the sandbox (and keeps its log) is unreachable, so the index stays: a
      // retry once the node is back answers with the step's record if it made it to the log, runs
      // the step if it never started, and is `step_in_doubt` if the node died in the middle of it
      const message = messageOf(error);
      return {
        observation: { type: 'error', code: 'node_lost', message },
        reward: 0,
        terminated: false,
        truncated: true,
        info: { episodeId: this.episodeId, stepIndex, replayed: false },
        outcome: { kind: 'infra_failure', reason: 'node_lost', message },
      };
    }
    faultPoint('env.step-answered');
    this.stepIndex++;
    const { result, replayed, logCapped, startedAt, durationMs } = reply;
    let signals = result.info.signals;
    if (logCapped && signals && 'limitsHit' in signals) {
      // the log kept this step with its long outputs cut: the caller has them whole, once
      signals = { ...signals, limitsHit: [...signals.limitsHit, 'log'] };
    }
    const info: StepInfo = {
      episodeId: this.episodeId,
      stepIndex,
      replayed,
      ...(signals ? { signals } : {}),
      startedAt,
      durationMs,
    };
    return { ...result, info };
  }

  /**
   * Who the agent acts as in `sandbox`: the env's user, else the one the env that made the
   * sandbox named (a task's agent user), else its environment's USER.
   */
  private userOf(sandbox: Sandbox): Promise<string> {
    if (this.options.user !== undefined) return Promise.resolve(this.options.user);
    const named = sandbox.labels[AGENT_USER_LABEL];
    if (named !== undefined) return Promise.resolve(named);
    const environment = sandbox.labels['environment'];
    if (!environment) return Promise.resolve('root');
    let user = this.environmentUsers.get(environment);
    if (!user) {
      user = this.platform.getEnvironment(environment).then((found) => found.config.user);
      this.environmentUsers.set(environment, user);
      user.catch(() => this.environmentUsers.delete(environment));
    }
    return user;
  }

  private async releaseSandbox(): Promise<void> {
    const sandbox = this.sandbox;
    this.sandbox = undefined;
    if (sandbox && this.owned) await sandbox.close();
    this.owned = false;
  }

  /**
   * Saves the sandbox's state at the deepest depth its backend offers, and says which: its
   * processes and memory too where it can (`depth: 'memory'`), else its files as an environment
   * (`depth: 'disk'`). Ask for `disk` to get an environment any sandbox can start from.
   */
  async checkpoint(options: { depth?: 'disk' | 'memory' } = {}): Promise<CheckpointRef> {
    const sandbox = this.sandbox;
    if (!sandbox) throw new SandgymError('failed_precondition', 'Call reset() before checkpoint()');
    if (options.depth !== 'disk') {
      const memory = await this.checkpointMemory();
      if (memory) return memory;
      if (options.depth === 'memory') {
        throw new SandgymError('unsupported', `A ${sandbox.backend} sandbox here has no memory checkpoints`);
      }
    }
    const count = ++this.checkpoints;
    const name = `ckpt-${sandbox.id}:${count}`;
    await this.platform.packDiff(sandbox, {
      name,
      description: `checkpoint ${count} of episode ${this.episodeId}`,
    });
    return { environment: name, episodeId: this.episodeId, stepIndex: this.stepIndex, depth: 'disk' };
  }

  /** A memory checkpoint of the sandbox, or undefined where its backend (or its state) allows none. */
  async checkpointMemory(): Promise<MemoryCheckpointRef | undefined> {
    const sandbox = this.sandbox;
    if (!sandbox) throw new SandgymError('failed_precondition', 'Call reset() before checkpoint()');
    const made = await sandbox.checkpoint().catch((error: unknown) => {
      if (isSandgymError(error, 'unsupported')) return undefined;
      throw error;
    });
    if (!made) return undefined;
    return {
      depth: 'memory',
      sandboxId: sandbox.id,
      checkpointId: made.id,
      environment: sandbox.labels['environment'] ?? '',
      episodeId: this.episodeId,
      stepIndex: this.stepIndex,
    };
  }

  /**
   * Goes back to a checkpoint: a memory checkpoint in place, in the sandbox that made it (which
   * must still be this env's); a disk checkpoint in a new sandbox. Either way the episode goes on
   * from there as a new branch.
   */
  async restore(
    ref: CheckpointRef,
    options: { episodeId?: string } = {},
  ): Promise<ResetResult<SandboxObservation, RestoredInfo>> {
    if (ref.depth === 'memory') return this.restoreInPlace(ref);
    const request = { ...(this.options.sandbox ?? {}), environment: ref.environment };
    const restored = SandboxEnv.create(this.platform, { ...this.options, sandbox: request });
    const episodeId = options.episodeId ?? `${ref.episodeId}@${ref.environment}`;
    const reset = await restored.reset({ options: { episodeId } });
    await this.releaseSandbox();
    this.sandbox = restored.sandbox;
    this.owned = true;
    this.episodeId = restored.episodeId;
    this.stepIndex = 0;
    restored.sandbox = undefined; // ownership moved here
    return { ...reset, info: { ...reset.info, restoredFrom: ref } };
  }

  private async restoreInPlace(
    ref: MemoryCheckpointRef,
  ): Promise<ResetResult<SandboxObservation, RestoredInfo>> {
    const sandbox = this.sandbox;
    if (sandbox?.id !== ref.sandboxId) {
      throw new SandgymError(
        'failed_precondition',
        `Memory checkpoint ${ref.checkpointId} restores in place, in sandbox ${ref.sandboxId}; this env's sandbox is ${sandbox?.id ?? 'none'}. Take a disk checkpoint (checkpoint({ depth: 'disk' })) to start elsewhere`,
      );
    }
    await sandbox.restore(ref.checkpointId);
    this.episodeId = `${ref.episodeId}@${ref.checkpointId}`;
    this.stepIndex = 0;
    return {
      observation: { type: 'reset', sandboxId: sandbox.id, environment: ref.environment },
      info: { episodeId: this.episodeId, sandboxId: sandbox.id, seed: null, restoredFrom: ref },
    };
  }

  async close(): Promise<void> {
    if (this.isClosed) return;
    this.isClosed = true;
    await this.releaseSandbox();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
