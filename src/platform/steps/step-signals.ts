import { messageOf } from '../../common/index.ts';
import type { StepCounters } from '../../backends/index.ts';
import type { Sandbox } from '../sandbox.ts';
import type { SandboxObservation } from './actions.ts';

/** A limit a step ran into (`log`: the sandbox's trajectory log is past its cap, see TrajectoryLog). */
export type LimitHit = 'pids' | 'memory' | 'output' | 'disk' | 'log';

/**
 * What one step did that a trainer should know about, beyond its observation: the audit
 * signals every step carries in its info and in the trajectory log.
 */
export interface StepSignals {
  /** Connections its network rules refused during the step. */
  deniedEgress: number;
  /** Protected paths written or deleted during the step (new since the step before). */
  protectedChanges: string[];
  limitsHit: LimitHit[];
  /** Processes still running in the sandbox when the step ended (daemons, strays). */
  leftoverProcesses: number;
}

/** What signals count from. */
interface Mark {
  deniedEgress: number;
  oomKills: number;
  pidsLimitHits: number;
  written: ReadonlySet<string>;
}

/** Within this of its cap, a sandbox's disk counts as full (the quota counts in blocks and metadata). */
const DISK_FULL_SLACK_BYTES = 1 << 20;

/**
 * Measures a sandbox around steps: counters and protected paths before the first step, then
 * after each, reporting what changed. Measuring is cheap (a few counters the backend reads without
 * leaving the event loop, see BackendSandbox.stepCounters, and an lstat per protected path) and
 * never fails a step: a sandbox that cannot be measured gets an error note.
 */
export class StepAuditor {
  private mark: Mark | undefined;

  constructor(
    readonly sandbox: Sandbox,
    private readonly protectedPaths: readonly string[],
  ) {}

  /** Takes the starting point, unless there is one (the end of the last step). */
  async beforeStep(): Promise<void> {
    if (this.mark) return;
    this.mark = (await this.measure().catch(() => undefined))?.mark;
  }

  async afterStep(observation: SandboxObservation): Promise<StepSignals | { error: string }> {
    const before = this.mark;
    let measured: Awaited<ReturnType<StepAuditor['measure']>>;
    try {
      measured = await this.measure();
    } catch (error) {
      this.mark = undefined;
      return { error: `cannot measure the sandbox after the step: ${messageOf(error)}` };
    }
    const { mark, diskBytes, pids } = measured;
    this.mark = mark;
    const limitsHit: LimitHit[] = [];
    if (mark.pidsLimitHits > (before?.pidsLimitHits ?? 0)) limitsHit.push('pids');
    if (mark.oomKills > (before?.oomKills ?? 0) || (observation.type === 'exec' && observation.oomKilled))
      limitsHit.push('memory');
    if (observation.type === 'exec' && (observation.stdoutTruncated || observation.stderrTruncated))
      limitsHit.push('output');
    if (diskBytes >= this.sandbox.resources.diskMib * 2 ** 20 - DISK_FULL_SLACK_BYTES) limitsHit.push('disk');
    return {
      deniedEgress: mark.deniedEgress - (before?.deniedEgress ?? 0),
      protectedChanges: [...mark.written].filter((path) => !before?.written.has(path)),
      limitsHit,
      // the agent (the sandbox's pid 1) is not the step's
      leftoverProcesses: Math.max(0, pids - 1),
    };
  }

  private async measure(): Promise<{ mark: Mark; diskBytes: number; pids: number }> {
    const [counters, written] = await Promise.all([
      this.sandbox.stepCounters ? this.sandbox.stepCounters() : this.sandbox.stats(),
      this.protectedPaths.length > 0 ? this.sandbox.writtenPaths(this.protectedPaths) : [],
    ]);
    const { deniedEgress, oomKills, pidsLimitHits, diskBytes, pids }: StepCounters = counters;
    return { mark: { deniedEgress, oomKills, pidsLimitHits, written: new Set(written) }, diskBytes, pids };
  }
}
