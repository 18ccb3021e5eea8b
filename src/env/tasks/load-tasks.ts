import { existsSync } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import { SandgymError, resolveBeneath } from '../../common/index.ts';
import type { HostEnvOptions } from './env-templates.ts';
import { isHarborTask, loadHarborTask } from './harbor.ts';
import { isOjProblem, loadOjProblem } from './oj.ts';
import { isSweBenchFile, loadSweBenchFile } from './swebench.ts';
import type { Task } from './task.ts';
import { isTerminalBenchTask, loadTerminalBenchTask } from './terminal-bench.ts';

/** The task formats, each recognised by what its folder or file holds. */
const FORMATS: {
  name: string;
  marker: string;
  is: (path: string) => boolean;
  load: (path: string, options: LoadTasksOptions) => Promise<Task[]>;
}[] = [
  {
    name: 'Harbor',
    marker: 'task.toml',
    is: isHarborTask,
    load: async (p, options) => [await loadHarborTask(p, options)],
  },
  {
    name: 'Terminal-Bench',
    marker: 'task.yaml and Dockerfile',
    is: isTerminalBenchTask,
    load: async (p) => [await loadTerminalBenchTask(p)],
  },
  { name: 'OJ', marker: 'a .oj.json file', is: isOjProblem, load: async (p) => [await loadOjProblem(p)] },
  { name: 'SWE-bench', marker: 'a .jsonl of rows', is: isSweBenchFile, load: (p) => loadSweBenchFile(p) },
];

function formatOf(path: string): (typeof FORMATS)[number] | undefined {
  return FORMATS.find((format) => format.is(path));
}

/** How tasks are loaded: which host variables their `${VAR}` templates may read. */
export type LoadTasksOptions = HostEnvOptions;

/**
 * Tasks named on the command line: a Harbor or Terminal-Bench task folder, an OJ problem, a
 * SWE-bench jsonl, or a folder of them.
 */
export async function loadTasks(paths: string[], options: LoadTasksOptions = {}): Promise<Task[]> {
  const tasks: Task[] = [];
  for (const path of paths) {
    if (!existsSync(path)) throw new SandgymError('not_found', `No task at ${path}`);
    const format = formatOf(path);
    if (format) {
      tasks.push(...(await format.load(path, options)));
      continue;
    }
    if (!(await stat(path)).isDirectory())
      throw new SandgymError('invalid_argument', `${path} is neither a task folder nor a folder of tasks`);
    // a folder of tasks is someone's too: an entry that links out of it is refused (a task
    // elsewhere is named on the command line itself)
    const children: string[] = [];
    for (const name of (await readdir(path)).sort())
      children.push(await resolveBeneath(path, name, `${path}: the entry`));
    const found = children.filter((child) => formatOf(child));
    if (found.length === 0)
      throw new SandgymError(
        'invalid_argument',
        `${path} holds no task: none of it or its subfolders has ${FORMATS.map((f) => `${f.marker} (${f.name})`).join(', ')}`,
      );
    for (const child of found) tasks.push(...(await formatOf(child)!.load(child, options)));
  }
  return tasks;
}
