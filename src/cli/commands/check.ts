import { TaskEnv, loadTasks } from '../../env/index.ts';
import { openPlatform } from './cluster.ts';
import { checkTask } from '../../rollout/index.ts';
import {
  IMAGE_SOURCE_OPTIONS,
  TASK_LOAD_OPTIONS,
  imageSources,
  jsonOutput,
  taskLoadOptions,
} from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

export const CHECK_COMMAND = {
  name: 'check',
  summary: 'the env checker: oracle passes, nop fails, no leaks, deterministic reset, replay, clean close',
  operands: 'TASK...',
  details:
    'Exits 0 when every check of every task passes, 1 when one fails, 2 for a task that cannot run as written.',
  options: { ...JSON_OPTION, ...IMAGE_SOURCE_OPTIONS, ...TASK_LOAD_OPTIONS },
} as const satisfies CommandSpec;

/** `sandgym check TASK... [--json [OUT]] [--fallback-base ENV]`: the agentic environment checker. */
export async function checkCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(CHECK_COMMAND, args);
  if (parsed.positionals.length === 0)
    throw new UsageError('sandgym check: give task folders, e.g. sandgym check examples/tasks');
  const json = await jsonOutput(parsed);
  const tasks = await loadTasks(parsed.positionals, taskLoadOptions(parsed));
  // one width for every task's id, so the columns line up however long the ids are
  const idWidth = Math.max(...tasks.map((task) => task.id.length));
  await using platform = await openPlatform({ images: imageSources(parsed) });
  const all: Record<string, Awaited<ReturnType<typeof checkTask>>> = {};
  for (const task of tasks) {
    // a task that cannot run as written (its environment does not build) is bad input: exit 2
    await TaskEnv.create(platform, task).prepare();
    const results = await checkTask(platform, task);
    all[task.id] = results;
    if (!json) {
      for (const r of results)
        console.log(
          `${task.id.padEnd(idWidth)}  ${r.passed ? 'pass' : 'FAIL'}  ${r.name.padEnd(40)} ${r.detail}`,
        );
    }
  }
  await json?.write(all);
  return Object.values(all).every((results) => results.every((r) => r.passed)) ? EXIT.ok : EXIT.failed;
}
