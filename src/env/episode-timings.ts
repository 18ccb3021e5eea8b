import { AsyncLocalStorage } from 'node:async_hooks';

/**
 * Where an episode's time goes, by phase, as Harbor's trial results say it and finer. Phases do
 * not overlap: time spent in a phase timed inside another counts for the inner one only, so the
 * phases of an episode add up to its wall time (less what no phase covers) and stack in a bar.
 */

/**
 * The phases, in the order an episode passes them. The task's own work (see {@link OWN_PHASES})
 * is what its author or the agent asked for; everything else is the platform's overhead.
 */
export const EPISODE_PHASES = [
  /** Building the task's environment, or finding it built. */
  'environment',
  /** Starting the task's docker-compose services and joining their network. */
  'services',
  /** Creating the agent's sandbox. */
  'create',
  /** Probing a clean sandbox of the environment for its interpreters (once per layer stack). */
  'probe',
  /** The image's ENTRYPOINT, its healthcheck and the task's setup script: the task's own. */
  'taskStartup',
  /** Making the agent's folders, staging the oracle's solution. */
  'staging',
  /** Setting a stage's network rules. */
  'network',
  /** The agent deciding: a model's think time, between steps. */
  'agent',
  /** The platform's part of each step: everything but the command the step ran. */
  'step',
  /** The commands the agent's steps ran, in the sandbox: the agent's own. */
  'command',
  /** Listing what the agent left running, reading its sandbox's network record. */
  'inspect',
  /** Packing the agent's changes into a layer for the grader. */
  'diff',
  /** Creating the grader's sandbox. */
  'graderCreate',
  /** Staging the tests and the harness in the grader, reading the reward. */
  'graderStaging',
  /** The task's test command itself: the verifier's own. */
  'tests',
  /** Ending the grader's sandbox. */
  'graderTeardown',
  /** Ending the agent's sandbox and the task's services. */
  'teardown',
] as const;

export type EpisodePhase = (typeof EPISODE_PHASES)[number];

/** Milliseconds per phase; phases that took no time are absent. */
export type EpisodeTimings = Partial<Record<EpisodePhase, number>>;

/** The phases that are the task's or the agent's own work, not the platform's. */
const OWN_PHASES: readonly EpisodePhase[] = ['taskStartup', 'agent', 'command', 'tests'];

/** What the platform added to an episode: every phase but the task's and the agent's own. */
export function overheadMs(timings: EpisodeTimings): number {
  return EPISODE_PHASES.filter((phase) => !OWN_PHASES.includes(phase)).reduce(
    (sum, phase) => sum + (timings[phase] ?? 0),
    0,
  );
}

/** One timed span in progress: what its own inner spans took, to leave out of its own. */
interface Span {
  innerMs: number;
}

/**
 * Adds up each phase's time for one episode. {@link time} nests: the phase timed innermost gets
 * the time, so a grading that times its test command leaves that out of the grading's own.
 */
export class PhaseClock {
  private readonly totals = new Map<EpisodePhase, number>();
  /** The span a call runs inside, followed through awaits: concurrent spans never mix. */
  private readonly enclosing = new AsyncLocalStorage<Span>();

  /** Runs `work`, counting its time (less any inner phases') to `phase`. */
  async time<T>(phase: EpisodePhase, work: () => Promise<T>): Promise<T> {
    const span: Span = { innerMs: 0 };
    const outer = this.enclosing.getStore();
    const started = performance.now();
    try {
      return await this.enclosing.run(span, work);
    } finally {
      const elapsed = performance.now() - started;
      this.add(phase, elapsed - span.innerMs);
      if (outer) outer.innerMs += elapsed;
    }
  }

  /** Counts `ms` measured elsewhere to `phase`. */
  add(phase: EpisodePhase, ms: number): void {
    if (!(ms > 0)) return;
    this.totals.set(phase, (this.totals.get(phase) ?? 0) + ms);
  }

  /** Moves `ms` of what was counted to `from` over to `to` (a step's command, out of the step). */
  move(from: EpisodePhase, to: EpisodePhase, ms: number): void {
    const moved = Math.min(ms, this.totals.get(from) ?? 0);
    if (!(moved > 0)) return;
    this.totals.set(from, (this.totals.get(from) ?? 0) - moved);
    this.add(to, moved);
  }

  /** The totals so far, in phase order, rounded to tenths of a millisecond. */
  snapshot(): EpisodeTimings {
    const out: EpisodeTimings = {};
    for (const phase of EPISODE_PHASES) {
      const ms = this.totals.get(phase);
      if (ms !== undefined && ms > 0) out[phase] = Math.round(ms * 10) / 10;
    }
    return out;
  }
}
