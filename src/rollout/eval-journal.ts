import { createHash } from 'node:crypto';
import { mkdir, open, readFile, rm } from 'node:fs/promises';
import { dirname } from 'node:path';
import type { EpisodeReport } from './episode-report.ts';

/**
 * The finished episodes of one evaluation, one JSON line each, fsynced as each finishes. An eval
 * that is killed and started again with the same tasks and agent skips what is in it. A line
 * torn by the crash is ignored.
 */
export class EvalJournal {
  private constructor(
    readonly path: string,
    private readonly finished: Map<string, EpisodeReport>,
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
    const text = await readFile(path, 'utf8').catch(() => '');
    for (const line of text.split('\n')) {
      try {
        const report = JSON.parse(line) as EpisodeReport;
        if (typeof report.task === 'string') finished.set(report.task, report);
      } catch {
        // a torn last line from a crash: that episode runs again
      }
    }
    return new EvalJournal(path, finished);
  }

  /** The report of a task that finished in an earlier run, if any. */
  get(task: string): EpisodeReport | undefined {
    return this.finished.get(task);
  }

  /** Forgets the journal once its evaluation has finished: a later eval starts afresh. */
  async remove(): Promise<void> {
    await rm(this.path, { force: true });
    this.finished.clear();
  }

  async record(report: EpisodeReport): Promise<void> {
    const file = await open(this.path, 'a');
    try {
      await file.write(`${JSON.stringify(report)}\n`);
      await file.datasync();
    } finally {
      await file.close();
    }
    this.finished.set(report.task, report);
  }
}
