import { createHash, type Hash } from 'node:crypto';
import { mkdir, open, readFile, rm, stat } from 'node:fs/promises';
import { dirname, isAbsolute, relative } from 'node:path';
import { plainJson, type Redactor } from '../common/index.ts';
import { filesUnder, type Task } from '../env/index.ts';
import type { EpisodeReport } from './episode-report.ts';

/** What an evaluation is, for its journal's key: every part changes the key. */
export interface JournalKey {
  tasks: readonly Task[];
  /** What the agent is (see ResolvedAgent.identity). */
  agent: string;
  maxSteps?: number;
}

/**
 * The files and folders a task's run reads: its Dockerfiles and build contexts, its tests and its
 * solution (any of them may be a symlink to a folder shared by several tasks).
 */
function referencedPaths(task: Task): string[] {
  const paths: string[] = [];
  const source = (s: { kind: string; dockerfile?: string; context?: string }) => {
    if (s.kind === 'dockerfile') paths.push(s.dockerfile!, s.context!);
  };
  source(task.environment);
  for (const service of task.services ?? []) source(service.source);
  if ('testsDir' in task.grading && task.grading.testsDir) paths.push(task.grading.testsDir);
  if (task.oracle?.kind === 'script') paths.push(task.oracle.dir);
  return [...new Set(paths)].filter((path) => isAbsolute(path)).sort();
}

/** Feeds the content of a file, or of every file of a folder, to `hash`, each named by its path. */
async function hashPath(hash: Hash, path: string): Promise<void> {
  const found = await stat(path).catch(() => undefined);
  if (!found) return void hash.update(`\0${path}\0missing`);
  const files = found.isDirectory() ? (await filesUnder(path)).sort() : [path];
  for (const file of files) {
    hash.update(`\0${path}\0${relative(path, file)}\0`);
    hash.update(await readFile(file).catch(() => Buffer.from('\0unreadable')));
  }
}

/**
 * Feeds a task's content to `hash`: what it loaded as, every file of its folder, and every file
 * its run reads, so an edit to any of them starts afresh.
 */
async function hashTask(hash: Hash, task: Task): Promise<void> {
  hash.update(JSON.stringify(task));
  const folder = await stat(task.source).catch(() => undefined);
  if (folder?.isDirectory()) await hashPath(hash, task.source);
  // each whole, even inside the folder: one reached through a symlink (a shared tests folder) is
  // read through it, where the walk of the folder passes symlinks by
  for (const path of referencedPaths(task)) await hashPath(hash, path);
}

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
    private readonly redactor: Redactor | undefined,
  ) {}

  /**
   * The journal's file under `dir` for an evaluation: a hash of the tasks' content, what the agent
   * is and the step limit, so a rerun with an edited agent module, another endpoint or model
   * options, or an edited task starts afresh instead of taking up results that are not its own.
   */
  static async pathFor(dir: string, key: JournalKey): Promise<string> {
    const hash = createHash('sha256').update(JSON.stringify([key.agent, key.maxSteps ?? null]));
    for (const task of [...key.tasks].sort((a, b) =>
      a.source < b.source ? -1 : a.source > b.source ? 1 : 0,
    ))
      await hashTask(hash, task);
    return `${dir}/${hash.digest('hex').slice(0, 16)}.jsonl`;
  }

  /**
   * `redactor` (the eval's secrets) is applied to each line once it is serialised, whatever field
   * or encoding a secret came through.
   */
  static async open(path: string, options: { redactor?: Redactor } = {}): Promise<EvalJournal> {
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
    return new EvalJournal(path, finished, started, options.redactor);
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
      // whatever a report holds (a bigint, a cycle, a throwing toJSON) is written: never lost
      const line = plainJson(entry);
      await file.write(`${this.redactor ? this.redactor.text(line) : line}\n`);
      await file.datasync();
    } finally {
      await file.close();
    }
  }
}
