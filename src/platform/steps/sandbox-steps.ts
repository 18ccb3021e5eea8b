import { SandgymError, faultPoint } from '../../common/index.ts';
import type { Sandbox } from '../sandbox.ts';
import { lookupStep, sameValue } from '../exactly-once.ts';
import type { TrajectoryLog } from '../trajectory-log.ts';
import { runAction } from './run-action.ts';
import { stepActionOf } from './step-action.ts';
import { StepAuditor } from './step-signals.ts';
import type { StepRecordResult, StepReply, StepRequest } from './step-types.ts';

interface Running {
  action: unknown;
  reply: Promise<StepReply>;
}

/**
 * The steps of one sandbox, run where the sandbox runs, exactly once. A step is looked up in the
 * trajectory log; one not there records its intent, runs, is audited, and is recorded (written
 * to the log, see TrajectoryLog for when it reaches the disk) before it answers. So:
 * - a step already recorded answers with its record, whoever asks and however often;
 * - a step still running is waited for, not run again (a retry, or a client that re-attached);
 * - a step whose intent is recorded but not its result ran in a node process that died: it is
 *   `step_in_doubt`, never silently run a second time.
 * A step runs to its end once started, even if the client that asked goes away: its command's
 * own time limit bounds it, and its record is there for whoever asks next.
 */
export class SandboxSteps {
  private readonly running = new Map<string, Running>();

  /** Whether a step is running now: its log must stay open until it is recorded. */
  get busy(): boolean {
    return this.running.size > 0;
  }
  private auditor: StepAuditor | undefined;
  private auditedPaths = '';

  constructor(
    readonly sandbox: Sandbox,
    private readonly log: TrajectoryLog,
  ) {}

  /**
   * Synchronous up to the step's registration, so a concurrent retry always finds it running. An
   * invalid action is a step like any other: its record (see stepActionOf) is logged, and it
   * answers an `invalid_action` observation.
   */
  async step(request: StepRequest): Promise<StepReply> {
    const action = stepActionOf(request.action);
    const key = `${request.episodeId}:${request.stepIndex}`;
    const running = this.running.get(key);
    if (running) {
      if (!sameValue(running.action, action)) {
        throw new SandgymError(
          'divergence',
          `Step ${request.stepIndex} of episode ${request.episodeId} is running another action: ${JSON.stringify(running.action)}`,
        );
      }
      return { ...(await running.reply), replayed: true };
    }
    const found = lookupStep(this.log, { ...request, action });
    if (found.kind === 'logged') {
      const { record } = found;
      return {
        result: record.result as StepRecordResult,
        replayed: true,
        logCapped: false,
        startedAt: record.startedAt,
        durationMs: record.durationMs,
      };
    }
    if (found.kind === 'started') {
      throw new SandgymError(
        'step_in_doubt',
        `Step ${request.stepIndex} of episode ${request.episodeId} started at ${found.intent.startedAt} on a node process that stopped before recording its result: it may or may not have taken effect in sandbox ${this.sandbox.id}. Check the sandbox's state and go on with a new episode, or restore a checkpoint`,
      );
    }
    const reply = this.runNew({ ...request, action });
    this.running.set(key, { action, reply });
    // forgotten once settled, however early: a step may end before its first await
    const forget = (): void => void this.running.delete(key);
    reply.then(forget, forget);
    return reply;
  }

  private async runNew(request: StepRequest): Promise<StepReply> {
    const { episodeId, stepIndex, action } = request;
    const startedAt = new Date().toISOString();
    const started = performance.now();
    faultPoint('step.before-intent');
    if (!this.log.recordIntent({ episodeId, stepIndex, action, startedAt })) return this.logFull(startedAt);
    faultPoint('step.after-intent');
    const result = await this.runAudited(request);
    faultPoint('step.after-action');
    const durationMs = performance.now() - started;
    const { capped } = this.log.append({
      episodeId,
      stepIndex,
      action,
      result,
      startedAt,
      durationMs,
    });
    faultPoint('step.after-record');
    return { result, replayed: false, logCapped: capped, startedAt, durationMs };
  }

  /**
   * The answer to a step the log has no room for: not run, and so not logged (whoever asks again
   * gets the same answer while the log stays full). The episode ends there, scored: a sandbox
   * that filled its own log, like one that filled its disk, is the agent's doing, never the
   * platform's failure.
   */
  private logFull(startedAt: string): StepReply {
    const { usedBytes, capBytes } = this.log.room;
    return {
      result: {
        observation: {
          type: 'error',
          code: 'resource_exhausted',
          message: `The trajectory log of sandbox ${this.sandbox.id} is full (${usedBytes} of ${capBytes} bytes: its disk cap or the node's log cap, whichever is less), so no more steps run in it: start a new episode in a new sandbox, or give it more disk (resources.diskMib)`,
        },
        reward: 0,
        terminated: true,
        truncated: false,
        outcome: { kind: 'ok' },
        info: {},
      },
      replayed: false,
      logCapped: true,
      startedAt,
      durationMs: 0,
    };
  }

  private async runAudited(request: StepRequest): Promise<StepRecordResult> {
    const options = request.options ?? {};
    // nothing runs: nothing to audit (the next step's audit counts from the last one audited)
    if (request.action.type === 'invalid') return runAction(this.sandbox, request.action, options);
    const protectedPaths = options.protectedPaths ?? [];
    // the audit counts from the step before, as long as it watches the same paths
    const paths = protectedPaths.join('\0');
    if (!this.auditor || this.auditedPaths !== paths) {
      this.auditor = new StepAuditor(this.sandbox, protectedPaths);
      this.auditedPaths = paths;
    }
    const auditor = this.auditor;
    await auditor.beforeStep();
    const result = await runAction(this.sandbox, request.action, options);
    if (result.outcome.kind === 'infra_failure') return result;
    const signals = await auditor.afterStep(result.observation);
    return { ...result, info: { signals } };
  }
}
