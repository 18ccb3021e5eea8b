// The main job on the embedded platform, no servers needed: start a container sandbox from the
// Debian base, run a few commands in it and tear it down; then build the example tasks'
// environments, evaluate them with the oracle and the do-nothing agent, print the rewards and
// write a report.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeFileAtomic } from '../src/common/index.ts';
import { loadTasks } from '../src/env/index.ts';
import { Platform, defaultDataDir, type LocalPlatform } from '../src/platform/index.ts';
import { BUILT_IN_AGENTS, RolloutRunner, renderHtmlReport, type StepEvent } from '../src/rollout/index.ts';

const TASKS = fileURLToPath(new URL('../../examples/tasks', import.meta.url));

const COMMANDS: string[][] = [
  ['python3', '-c', 'import platform, sys; print(f"python {platform.python_version()}: 6*7 = {6*7}")'],
  ['git', '--version'],
  [
    'sh',
    '-c',
    'echo "kernel $(uname -r), pid $$ of $(ls /proc | grep -c "^[0-9]") processes, host name $(hostname)"',
  ],
  ['sh', '-c', 'echo state persists > /tmp/note && cat /tmp/note'],
  ['ls', '/no/such/path'],
];

async function sandboxTour(platform: LocalPlatform): Promise<void> {
  const started = performance.now();
  await using sandbox = await platform.createSandbox({
    environment: 'debian:bookworm',
    resources: { memoryMib: 256 },
  });
  console.log(
    `sandbox ${sandbox.id} (${sandbox.backend}, debian:bookworm) ready in ${(performance.now() - started).toFixed(0)} ms\n`,
  );
  for (const argv of COMMANDS) {
    const result = await sandbox.exec(argv, { timeoutMs: 30_000 });
    console.log(`$ ${argv.join(' ')}`);
    if (result.stdout) process.stdout.write(result.stdout);
    if (result.stderr) process.stdout.write(`[stderr] ${result.stderr}`);
    console.log(`-> exit ${result.exitCode ?? result.signal} in ${result.durationMs.toFixed(1)} ms\n`);
  }
  await sandbox.writeFile('/work/hello.txt', 'written by the host\n');
  console.log(`read back: ${(await sandbox.readFile('/work/hello.txt')).toString().trim()}`);
  const stats = await sandbox.stats();
  console.log(
    `memory ${(stats.memoryBytes / 2 ** 20).toFixed(1)} MiB, cpu ${stats.cpuUsageMs.toFixed(0)} ms, ${stats.pids} process(es)`,
  );
  console.log('tearing the sandbox down');
}

async function evaluation(platform: LocalPlatform): Promise<void> {
  const tasks = await loadTasks([TASKS]);
  const dir = join(defaultDataDir(), 'reports');
  await mkdir(dir, { recursive: true });
  for (const agent of ['oracle', 'nop']) {
    console.log(`\nevaluating ${tasks.length} example tasks with the ${agent} agent`);
    const runner = new RolloutRunner(platform, BUILT_IN_AGENTS[agent]!, { concurrency: 2 });
    const steps: StepEvent[] = [];
    runner.steps$.subscribe((step) => steps.push(step));
    runner.rewards$.subscribe(({ task, reward }) => console.log(`  ${task.padEnd(12)} reward ${reward}`));
    const episodes = await runner.run(tasks);
    const report = join(dir, `quickstart-${agent}.html`);
    await writeFileAtomic(join(dir, `quickstart-${agent}.json`), JSON.stringify(episodes, null, 2));
    await writeFileAtomic(
      report,
      renderHtmlReport(`quickstart: example tasks, ${agent} agent`, episodes, steps),
    );
    console.log(`  report: ${report}`);
  }
}

async function main(): Promise<void> {
  await using platform = await Platform.local();
  await sandboxTour(platform);
  await evaluation(platform);
}

await main();
