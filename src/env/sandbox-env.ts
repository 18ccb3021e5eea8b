import { randomBytes } from 'node:crypto';
import { SandgymError, isSandgymError, messageOf, parseAt, type FailureReason } from '../common/index.ts';
import {
  ExactlyOnceSteps,
  type PlatformClient,
  type Sandbox,
  type SandboxRequest,
} from '../platform/index.ts';
import type {
  EnvCallOptions,
  Environment,
  ResetOptions,
  ResetResult,
  StepOutcome,
  StepResult,
} from './environment.ts';
import { sandboxActionSchema, type SandboxAction, type SandboxObservation } from './sandbox-actions.ts';
import { inSession } from './shell-session.ts';
import { StepAuditor, type StepSignals } from './step-signals.ts';

/**
 * Errors that mean the platform failed, not the agent: they become typed outcomes. An `oom` is
 * not one of them: a sandbox that ran out of its own memory limit (even when the OOM killer took
 * its agent with it) did so through what the agent ran, so the step is scored and the episode
 * ends there.
 */
const INFRA_CODES: Record<string, FailureReason> = {
  agent_crash: 'agent_crash',
  platform_error: 'platform_error',
  admission_rejected: 'admission_rejected',
};

/** A command's time limit: what the action asks, within the cap, in whole milliseconds. */
function commandTimeout(asked: number | undefined, cap: number | undefined): { timeoutMs?: number } {
  const limit = cap === undefined ? asked : Math.min(asked ?? cap, cap);
  return limit === undefined ? {} : { timeoutMs: Math.max(1, Math.floor(limit)) };
}

/** Where a checkpoint's state is kept: an environment in the store, and where the episode was. */
export interface CheckpointRef {
  environment: string;
  episodeId: string;
  stepIndex: number;
  /** `disk`: files, not processes or memory (containers); `memory` would include both. */
  depth: 'disk' | 'memory';
}

/** Options for {@link SandboxEnv.create}. */
export interface SandboxEnvOptions {
  /** The sandbox each reset starts; its `environment` names the layer stack. */
  sandbox?: SandboxRequest;
  /** Absolute paths whose changes each step reports in `info.signals.protectedChanges`. */
  protectedPaths?: readonly string[];
  /** Who `exec` actions run as ("name", "uid", "name:group"); default root. */
  user?: string;
}

/**
 * A gym environment over one sandbox: each reset starts a fresh sandbox, each step is an action
 * in it. Steps go through the sandbox's trajectory log, exactly once: a client that crashed and
 * retries, or another client that attaches, fast-forwards over what already ran.
 */
export class SandboxEnv implements Environment<SandboxAction, SandboxObservation> {
  private sandbox: Sandbox | undefined;
  private owned = false;
  private steps: ExactlyOnceSteps | undefined;
  private episodeId = '';
  private stepIndex = 0;
  private isClosed = false;
  private checkpoints = 0;
  private auditor: StepAuditor | undefined;

  private constructor(
    private readonly platform: PlatformClient,
    private readonly options: SandboxEnvOptions,
  ) {}

  static create(platform: PlatformClient, options: SandboxEnvOptions = {}): SandboxEnv {
    return new SandboxEnv(platform, options);
  }

  /**
   * Attaches to a live sandbox and an episode another client started; its next steps replay
   * from the log until they reach the tail. The attached env destroys the sandbox on close
   * only when told it now `owned` it (the client that started it is gone).
   */
  static async attach(
    platform: PlatformClient,
    sandbox: Sandbox,
    episodeId: string,
    options: { owned?: boolean; protectedPaths?: readonly string[] } = {},
  ): Promise<SandboxEnv> {
    const env = new SandboxEnv(
      platform,
      options.protectedPaths ? { protectedPaths: options.protectedPaths } : {},
    );
    env.sandbox = sandbox;
    env.owned = options.owned ?? false;
    env.episodeId = episodeId;
    env.steps = new ExactlyOnceSteps(await platform.stepLog(sandbox.id));
    return env;
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

  async reset(options: ResetOptions = {}): Promise<ResetResult<SandboxObservation>> {
    if (this.isClosed)
      throw new SandgymError('failed_precondition', 'Cannot reset: the environment is closed');
    await this.releaseSandbox();
    const sandbox = await this.platform.createSandbox(
      this.options.sandbox ?? {},
      options.signal ? { signal: options.signal } : {},
    );
    this.sandbox = sandbox;
    this.owned = true;
    this.steps = new ExactlyOnceSteps(await this.platform.stepLog(sandbox.id));
    const given = options.options?.['episodeId'];
    this.episodeId = typeof given === 'string' ? given : randomBytes(8).toString('hex');
    this.steps.startEpisode(this.episodeId); // a fresh sandbox: its log is empty
    this.stepIndex = 0;
    const environment = sandbox.labels['environment'] ?? '';
    return {
      observation: { type: 'reset', sandboxId: sandbox.id, environment },
      info: { episodeId: this.episodeId, sandboxId: sandbox.id, seed: options.seed ?? null },
    };
  }

  async step(action: SandboxAction, options: EnvCallOptions = {}): Promise<StepResult<SandboxObservation>> {
    const valid = parseAt(sandboxActionSchema, action, 'action');
    const sandbox = this.sandbox;
    const steps = this.steps;
    if (!sandbox || !steps) throw new SandgymError('failed_precondition', 'Call reset() before step()');
    const stepIndex = this.stepIndex;
    let ran: { result: StepResult<SandboxObservation>; replayed: boolean; logCapped?: boolean };
    try {
      ran = await steps.run({ episodeId: this.episodeId, stepIndex, action: valid }, () =>
        this.executeAudited(sandbox, valid, options),
      );
    } catch (error) {
      if (!isSandgymError(error, 'node_lost')) throw error;
      // the node that runs the sandbox (and keeps its log) is unreachable, so nothing was logged
      // and the index stays: a retry once the node is back replays the step if its record made
      // it to the log, and runs it otherwise. (A node that died in the middle of a command may
      // have run it unlogged; a node that died between steps lost nothing.)
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
    const { result, replayed, logCapped } = ran;
    this.stepIndex++;
    const info: Record<string, unknown> = { ...result.info, episodeId: this.episodeId, stepIndex, replayed };
    const signals = info['signals'] as StepSignals | { error: string } | undefined;
    if (logCapped && signals && 'limitsHit' in signals) {
      // the log kept this step with its long outputs cut: the caller has them whole, once
      info['signals'] = { ...signals, limitsHit: [...signals.limitsHit, 'log'] };
    }
    return { ...result, info };
  }

  /** Runs an action with its audit signals in `info.signals`, which the trajectory log keeps too. */
  private async executeAudited(
    sandbox: Sandbox,
    action: SandboxAction,
    options: EnvCallOptions,
  ): Promise<StepResult<SandboxObservation>> {
    if (this.auditor?.sandbox !== sandbox) {
      this.auditor = new StepAuditor(sandbox, this.options.protectedPaths ?? []);
    }
    const auditor = this.auditor;
    await auditor.beforeStep();
    const result = await this.execute(sandbox, action, options);
    if (result.outcome.kind === 'infra_failure') return result;
    return { ...result, info: { ...result.info, signals: await auditor.afterStep(result.observation) } };
  }

  private async execute(
    sandbox: Sandbox,
    action: SandboxAction,
    options: EnvCallOptions,
  ): Promise<StepResult<SandboxObservation>> {
    const call = options.signal ? { signal: options.signal } : {};
    const ok: StepOutcome = { kind: 'ok' };
    const done = (observation: SandboxObservation, terminated = false): StepResult<SandboxObservation> => ({
      observation,
      reward: 0,
      terminated,
      truncated: false,
      info: {},
      outcome: ok,
    });
    try {
      switch (action.type) {
        case 'exec': {
          const session = action.session ? inSession(action.session, action.command, action.cwd) : undefined;
          const argv =
            session?.argv ??
            (typeof action.command === 'string' ? ['/bin/sh', '-c', action.command] : action.command);
          const env = { ...action.env, ...session?.env };
          const r = await sandbox.exec(argv, {
            ...call,
            ...(this.options.user ? { user: this.options.user } : {}),
            ...(action.cwd && !session ? { cwd: action.cwd } : {}),
            ...(Object.keys(env).length ? { env } : {}),
            ...commandTimeout(action.timeoutMs, options.commandTimeoutCapMs),
          });
          return done({
            type: 'exec',
            stdout: r.stdout,
            stderr: r.stderr,
            exitCode: r.exitCode,
            signal: r.signal,
            timedOut: r.timedOut,
            oomKilled: r.oomKilled,
            stdoutTruncated: r.stdoutTruncated,
            stderrTruncated: r.stderrTruncated,
            durationMs: r.durationMs,
          });
        }
        case 'write_file':
          await sandbox.writeFile(action.path, action.content, call);
          return done({ type: 'written', path: action.path });
        case 'read_file':
          return done({
            type: 'file',
            path: action.path,
            content: (await sandbox.readFile(action.path, call)).toString(),
          });
        case 'list_dir': {
          const entries = await sandbox.listDir(action.path, call);
          return done({
            type: 'dir',
            path: action.path,
            entries: entries.map(({ name, type, size }) => ({ name, type, size })),
          });
        }
        case 'submit':
          return done({ type: 'submitted' }, true);
      }
    } catch (error) {
      if (isSandgymError(error, 'node_lost')) throw error; // not a result: step() reports it unlogged
      if (isSandgymError(error, 'oom') || (isSandgymError(error) && sandbox.failure === 'oom')) {
        return done({ type: 'error', code: 'oom', message: messageOf(error) }, true);
      }
      // a sandbox that died under the call (killed, crashed) reports why through its own state
      const reason = isSandgymError(error) ? (INFRA_CODES[error.code] ?? sandbox.failure) : undefined;
      if (reason) {
        // the platform failed, not the agent: a typed outcome, never a reward of 0 in disguise
        return {
          ...done({ type: 'error', code: reason, message: messageOf(error) }),
          truncated: true,
          outcome: { kind: 'infra_failure', reason, message: messageOf(error) },
        };
      }
      if (isSandgymError(error)) return done({ type: 'error', code: error.code, message: error.message });
      throw error;
    }
  }

  private async releaseSandbox(): Promise<void> {
    const sandbox = this.sandbox;
    this.sandbox = undefined;
    this.steps = undefined;
    if (sandbox && this.owned) await sandbox.close();
    this.owned = false;
  }

  /**
   * Saves the sandbox's state at the depth its backend offers (for containers: the filesystem,
   * not the processes) as an environment, and returns a reference to restore from.
   */
  async checkpoint(): Promise<CheckpointRef> {
    const sandbox = this.sandbox;
    if (!sandbox) throw new SandgymError('failed_precondition', 'Call reset() before checkpoint()');
    const count = ++this.checkpoints;
    const name = `ckpt-${sandbox.id}:${count}`;
    await this.platform.packDiff(sandbox, {
      name,
      description: `checkpoint ${count} of episode ${this.episodeId}`,
    });
    return { environment: name, episodeId: this.episodeId, stepIndex: this.stepIndex, depth: 'disk' };
  }

  /** Starts a new sandbox from a checkpoint; the episode goes on from there as a new branch. */
  async restore(ref: CheckpointRef): Promise<ResetResult<SandboxObservation>> {
    const request = { ...(this.options.sandbox ?? {}), environment: ref.environment };
    const restored = SandboxEnv.create(this.platform, { ...this.options, sandbox: request });
    const reset = await restored.reset({ options: { episodeId: `${ref.episodeId}@${ref.environment}` } });
    await this.releaseSandbox();
    this.sandbox = restored.sandbox;
    this.owned = true;
    this.steps = restored.steps;
    this.episodeId = restored.episodeId;
    this.stepIndex = 0;
    restored.sandbox = undefined; // ownership moved here
    return { ...reset, info: { ...reset.info, restoredFrom: ref } };
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
