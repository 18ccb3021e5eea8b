import { TaskEnv, loadTasks } from '../../env/index.ts';
import { openPlatform } from './cluster.ts';
import { checkTask } from '../../rollout/index.ts';
import {
  IMAGE_SOURCE_OPTIONS,
  TASK_LOAD_OPTIONS,
  imageSources,
  parseCommandArgs,
  taskLoadOptions,
} from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/** `sandgym check TASK... [--json] [--fallback-base ENV]`: the agentic environment checker. */
export async function checkCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('check', args, {
    json: { type: 'boolean' },
    ...IMAGE_SOURCE_OPTIONS,
    ...TASK_LOAD_OPTIONS,
  });
  if (parsed.positionals.length === 0)
    throw new UsageError('sandgym check: give task folders, e.g. sandgym check examples/tasks');
  const tasks = await loadTasks(parsed.positionals, taskLoadOptions(parsed));
  await using platform = await openPlatform({ images: imageSources(parsed) });
  const all: Record<string, Awaited<ReturnType<typeof checkTask>>> = {};
  for (const task of tasks) {
    // a task that cannot run as written (its environment does not build) is bad input: exit 2
    await TaskEnv.create(platform, task).prepare();
    const results = await checkTask(platform, task);
    all[task.id] = results;
    if (!parsed.values['json']) {
      for (const r of results)
        console.log(`${task.id.padEnd(14)} ${r.passed ? 'pass' : 'FAIL'}  ${r.name.padEnd(40)} ${r.detail}`);
    }
  }
  if (parsed.values['json']) console.log(JSON.stringify(all));
  return Object.values(all).every((results) => results.every((r) => r.passed)) ? EXIT.ok : EXIT.failed;
}
