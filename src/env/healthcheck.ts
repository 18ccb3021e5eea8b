import type { Sandbox } from '../platform/index.ts';
import { TaskError, type TaskHealthcheck } from './tasks/task.ts';

/** How much of the last probe's output a failed healthcheck's message carries. */
const OUTPUT_TAIL_CHARS = 800;

/** Who a probe runs as and where, as the container's own processes run. */
export interface ProbeOptions {
  user?: string;
  cwd?: string;
}

/** What one probe did. */
interface Probe {
  passed: boolean;
  /** `exit 1`, `timed out after 2000 ms`. */
  how: string;
  output: string;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function probe(sandbox: Sandbox, check: TaskHealthcheck, options: ProbeOptions): Promise<Probe> {
  // Docker runs a shell-form HEALTHCHECK as `/bin/sh -c`, and kills a probe at its timeout
  const run = await sandbox.exec(['/bin/sh', '-c', check.command], {
    timeoutMs: check.timeoutMs,
    ...(options.user ? { user: options.user } : {}),
    ...(options.cwd ? { cwd: options.cwd } : {}),
  });
  const output = `${run.stdout}${run.stderr}`;
  if (run.timedOut) return { passed: false, how: `timed out after ${check.timeoutMs} ms`, output };
  if (run.exitCode === 0) return { passed: true, how: 'exit 0', output };
  return {
    passed: false,
    how: run.exitCode === null ? `killed by ${run.signal}` : `exit ${run.exitCode}`,
    output,
  };
}

/**
 * Waits for a task's sandbox to be healthy, with Docker HEALTHCHECK's meaning: during the start
 * period a probe every `startIntervalMs`, whose failures do not count; after it a probe every
 * `intervalMs`, and `retries` failures in a row fail the start. The first passing probe ends the
 * wait. A failure is the task's ({@link TaskError}), naming the command, how often it failed and
 * what its last probe printed.
 */
export async function waitHealthy(
  taskId: string,
  sandbox: Sandbox,
  check: TaskHealthcheck,
  options: ProbeOptions = {},
): Promise<{ probes: number }> {
  const started = Date.now();
  const inStartPeriod = () => Date.now() - started < check.startPeriodMs;
  let probes = 0;
  let startFailures = 0;
  let failures = 0;
  for (;;) {
    const starting = inStartPeriod();
    await sleep(starting ? check.startIntervalMs : check.intervalMs);
    const result = await probe(sandbox, check, options);
    probes++;
    if (result.passed) return { probes };
    // a probe that began in the start period does not count, even if it ends after it
    if (starting) {
      startFailures++;
      continue;
    }
    failures++;
    if (failures < check.retries) continue;
    const tail = result.output.trim().slice(-OUTPUT_TAIL_CHARS);
    throw new TaskError(
      taskId,
      `its healthcheck \`${check.command}\` failed ${failures} times in a row after its start period of ${check.startPeriodMs} ms (${probes} probes in all, ${startFailures} failed during the start period); the last ${result.how}${tail ? `, printing:\n${tail}` : ' and printed nothing'}`,
    );
  }
}
