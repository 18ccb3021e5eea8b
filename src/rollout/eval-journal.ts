import { createHash } from 'node:crypto';
import { mkdir, open, readFile, rm } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { EpisodeReport } from './episode-report.ts';

/** An episode that started: where it runs, so a resumed eval can take it over. */
export interface StartedEpisode {
  task: string;
  sandboxId: string;
  episodeId: string;
}

/**
 * The episodes of one evaluation, one JSON line each, fsynced: each start (where it runs) and
 * each finish (its report). An eval that is killed and started again with the same tasks and
 * agent skips the finished ones and takes over the started ones whose sandbox is still alive.
 * A line torn by the crash is ignored.
 */
export class EvalJournal {
  private constructor(
    readonly path: string,
    private readonly finished: Map<string, EpisodeReport>,
    private readonly started: Map<string, StartedEpisode>,
  ) {}

  /** The journal's file for a set of tasks and an agent, under `dir`. */
  static pathFor(dir: string, taskDirs: string[], agent: string): string {
    const key = createHash('sha256')
      .update(JSON.stringify([[...taskDirs].sort(), agent]))
      .digest('hex')
      .slice(0, 16);
    return `${dir}/${key}.jsonl`;
  }

  static async open(path: string): Promise<EvalJournal> {
    await mkdir(dirname(path), { recursive: true });
    const finished = new Map<string, EpisodeReport>();
    const started = new Map<string, StartedEpisode>();
    const text = await readFile(path, 'utf8').catch(() => '');
    for (const line of text.split('\n')) {
      try {
        const entry = JSON.parse(line) as EpisodeReport | { started: StartedEpisode };
        if ('started' in entry) started.set(entry.started.task, entry.started);
        else if (typeof entry.task === 'string') finished.set(entry.task, entry);
      } catch {
        // a torn last line from a crash: that episode runs again
      }
    }
    return new EvalJournal(path, finished, started);
  }

  /** The report of a task that finished in an earlier run, if any. */
  get(task: string): EpisodeReport | undefined {
    return this.finished.get(task);
  }

  /** Where a task's episode ran when an earlier run was interrupted, if it started. */
  startedEpisode(task: string): StartedEpisode | undefined {
    return this.finished.has(task) ? undefined : this.started.get(task);
  }

  /** Notes where an episode runs, before its first step. */
  async recordStart(episode: StartedEpisode): Promise<void> {
    await this.append({ started: episode });
    this.started.set(episode.task, episode);
  }

  /** Forgets the journal once its evaluation has finished: a later eval starts afresh. */
  async remove(): Promise<void> {
    await rm(this.path, { force: true });
    this.finished.clear();
  }

  async record(report: EpisodeReport): Promise<void> {
    await this.append(report);
    this.finished.set(report.task, report);
  }

  private async append(entry: unknown): Promise<void> {
    const file = await open(this.path, 'a');
    try {
      await file.write(`${JSON.stringify(entry)}\n`);
      await file.datasync();
    } finally {
      await file.close();
    }
  }
}
