// The main job on the embedded platform: start a container sandbox from the Debian base, run a
// few commands in it, print their output and exit codes, and tear it down. No servers needed.
import { Platform } from '../src/platform/index.ts';

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

async function main(): Promise<void> {
  await using platform = await Platform.local();
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

await main();
