import { isSandgymError, messageOf, type FailureReason } from '../../common/index.ts';
import { isRootUser } from '../../backends/index.ts';
import type { Sandbox } from '../sandbox.ts';
import type { SandboxObservation, StepAction } from './actions.ts';
import { inSession } from './shell-session.ts';
import type { StepOptions, StepRecordResult } from './step-types.ts';

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

function done(observation: SandboxObservation, terminated = false): StepRecordResult {
  return { observation, reward: 0, terminated, truncated: false, outcome: { kind: 'ok' }, info: {} };
}

/** What an action may do in a sandbox: every call as one user. */
type ActingSandbox = Pick<Sandbox, 'exec' | 'readFile' | 'writeFile' | 'listDir'>;

/**
 * The sandbox as the step's user sees it: each call carries the user, whatever its options, so
 * no action can do anything as root by leaving the user out. Absent: root.
 */
function actingAs(sandbox: Sandbox, user: string | undefined): ActingSandbox {
  if (isRootUser(user)) return sandbox;
  return {
    exec: (argv, options) => sandbox.exec(argv, { ...options, user }),
    readFile: (path, options) => sandbox.readFile(path, { ...options, user }),
    writeFile: (path, data, options) => sandbox.writeFile(path, data, { ...options, user }),
    listDir: (path, options) => sandbox.listDir(path, { ...options, user }),
  };
}

/**
 * Runs one action in a sandbox, as the step's user. What the agent did wrong is an observation (an
 * invalid action too: it runs nothing, and the episode goes on); what the platform did wrong is a
 * typed `infra_failure`. A lost node is thrown: there is no result to record.
 */
export async function runAction(
  sandbox: Sandbox,
  action: StepAction,
  options: StepOptions,
): Promise<StepRecordResult> {
  try {
    return await act(actingAs(sandbox, options.user), action, options);
  } catch (error) {
    if (isSandgymError(error, 'node_lost')) throw error;
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

/** The action itself, through the acting view only: it has no way to reach the sandbox as root. */
async function act(
  sandbox: ActingSandbox,
  action: StepAction,
  options: StepOptions,
): Promise<StepRecordResult> {
  switch (action.type) {
    case 'invalid':
      return done({ type: 'error', code: 'invalid_action', message: action.problem });
    case 'exec': {
      const session = action.session ? inSession(action.session, action.command, action.cwd) : undefined;
      const argv =
        session?.argv ??
        (typeof action.command === 'string' ? ['/bin/sh', '-c', action.command] : action.command);
      const env = { ...action.env, ...session?.env };
      const r = await sandbox.exec(argv, {
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
      await sandbox.writeFile(action.path, action.content);
      return done({ type: 'written', path: action.path });
    case 'read_file':
      return done({
        type: 'file',
        path: action.path,
        content: (await sandbox.readFile(action.path)).toString(),
      });
    case 'list_dir': {
      const entries = await sandbox.listDir(action.path);
      return done({
        type: 'dir',
        path: action.path,
        entries: entries.map(({ name, type, size }) => ({ name, type, size })),
        ...(entries.truncated ? { truncated: true as const } : {}),
      });
    }
    case 'submit':
      return done({ type: 'submitted' }, true);
  }
}
