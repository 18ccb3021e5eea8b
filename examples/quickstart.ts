// The main job on the embedded platform, no servers needed: start a container sandbox from the
// Debian base, run a few commands in it and tear it down; preempt a training run's sandboxes (their
// memory freed) and roll them out again with their processes as they were; then build the example
// tasks' environments, evaluate them with the oracle and the do-nothing agent, print the rewards,
// where an episode's time went, and write a report.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { writeFileAtomic } from '../src/common/index.ts';
import { loadTasks } from '../src/env/index.ts';
import { Platform, defaultDataDir, type LocalPlatform } from '../src/platform/index.ts';
import {
  BUILT_IN_AGENTS,
  RolloutRunner,
  TrainingCoordinator,
  renderHtmlReport,
  type StepEvent,
} from '../src/rollout/index.ts';

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

/** A process that holds 64 MiB of its own memory and counts, so a resume shows it kept both. */
const HOLDER = `import time
block = bytearray(64 << 20)
for i in range(0, len(block), 4096): block[i] = 1
n = 0
while True:
    n += 1
    open('/tmp/count', 'w').write(str(n))
    time.sleep(0.05)`;

const MIB = 2 ** 20;

/**
 * What a trainer's preemption does: the run's idle sandboxes hibernate (their memory freed, by a
 * CRIU dump where the host has CRIU, else to swap) and come back at rollout, processes and all.
 */
async function preemption(platform: LocalPlatform): Promise<void> {
  console.log('\npreempting a training run of 2 sandboxes, each with a process holding 64 MiB');
  await using run = await TrainingCoordinator.start(platform, { name: 'quickstart', leaseMs: 60_000 });
  const sandboxes = await Promise.all(
    [0, 1].map(() =>
      platform.createSandbox({
        environment: 'debian:bookworm',
        run: run.name,
        resources: { memoryMib: 256 },
      }),
    ),
  );
  try {
    for (const sandbox of sandboxes) {
      await sandbox.writeFile('/tmp/holder.py', HOLDER);
      await sandbox.exec(['sh', '-c', 'python3 /tmp/holder.py >/dev/null 2>&1 &']);
    }
    await new Promise((done) => setTimeout(done, 500));
    const held = await Promise.all(sandboxes.map(async (s) => (await s.stats()).memoryBytes));
    const preempted = await run.phase('preempted');
    const resident = held.reduce((a, b) => a + b, 0);
    console.log(
      `  preempted: ${preempted.hibernated.length} hibernated, freed ${(preempted.freedBytes / MIB).toFixed(0)} of ${(resident / MIB).toFixed(0)} MiB`,
    );
    for (const kept of preempted.keptMemory)
      console.log(`  kept in memory: ${kept.sandboxId}: ${kept.reason}`);
    const started = performance.now();
    await run.phase('rollout');
    const counts = await Promise.all(
      sandboxes.map(async (s) => (await s.exec(['cat', '/tmp/count'])).stdout.trim()),
    );
    console.log(
      `  rollout: back in ${(performance.now() - started).toFixed(0)} ms, their processes still counting (${counts.join(', ')})`,
    );
  } finally {
    await Promise.all(sandboxes.map((s) => s.close()));
  }
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
    for (const episode of episodes.filter((e) => e.timings)) {
      const phases = Object.entries(episode.timings ?? {})
        .filter(([, ms]) => ms >= 1)
        .map(([phase, ms]) => `${phase} ${Math.round(ms)}`)
        .join(', ');
      console.log(
        `  ${episode.task.padEnd(16)} ${Math.round(episode.overheadMs ?? 0)} ms platform; ms by phase: ${phases}`,
      );
    }
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
  await preemption(platform);
  await evaluation(platform);
}

await main();
