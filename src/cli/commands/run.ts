import { BACKEND_NAMES } from '../../backends/index.ts';
import { MAX_COMMAND_TIMEOUT_MS, SANDBOX_LIMITS } from '../../platform/index.ts';
import { openPlatform } from './cluster.ts';
import { HOST_MEMORY_MIB, jsonOutput, numberOf, text } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/**
 * The most memory a sandbox may ask for: this host's, where it runs here; what a sandbox request
 * accepts at all, on a cluster (a node may be bigger than this host, and it checks its own).
 */
const MAX_MEMORY_MIB = process.env['SANDGYM_PLATFORM']
  ? SANDBOX_LIMITS.maxMemoryMib
  : Math.min(HOST_MEMORY_MIB, SANDBOX_LIMITS.maxMemoryMib);

export const RUN_COMMAND = {
  name: 'run',
  summary: 'one sandbox, one command: its output and exit code, then teardown',
  operands: '-- CMD ...',
  takesCommandLine: true,
  details:
    'Exits with 0 when CMD exits 0, else 1. On the cluster at $SANDGYM_PLATFORM when it is set;\n' +
    "there --memory-mib may exceed this host's memory, as a node may be bigger.",
  options: {
    backend: {
      type: 'string',
      value: 'B',
      default: 'container',
      description: `the isolation: ${BACKEND_NAMES.join(', ')}`,
    },
    env: { type: 'string', value: 'NAME:VERSION', description: 'the environment (default debian:bookworm)' },
    ...JSON_OPTION,
    'timeout-ms': {
      type: 'integer',
      range: [1, MAX_COMMAND_TIMEOUT_MS],
      description: "the command's time limit",
    },
    'memory-mib': {
      type: 'integer',
      range: [SANDBOX_LIMITS.minMemoryMib, MAX_MEMORY_MIB],
      description: "the sandbox's memory limit",
    },
    'load-mode': {
      type: 'string',
      value: 'MODE',
      default: 'ondemand',
      description: 'how layers are had: ondemand, eager or tar',
    },
  },
} as const satisfies CommandSpec;

/** `sandgym run [--backend B] [--env E] [--load-mode M] [--json [OUT]] -- CMD ...`. */
export async function runCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(RUN_COMMAND, args);
  const argv = parsed.commandLine.length ? parsed.commandLine : parsed.positionals;
  if (argv.length === 0 || !argv[0]) {
    throw new UsageError('sandgym run: the command is empty; give one after --, e.g. sandgym run -- echo hi');
  }
  const memoryMib = numberOf(parsed, 'memory-mib');
  const timeoutMs = numberOf(parsed, 'timeout-ms');
  const environment = text(parsed, 'env');
  const backend = text(parsed, 'backend') ?? 'container';
  if (!(BACKEND_NAMES as readonly string[]).includes(backend)) {
    throw new UsageError(
      `sandgym run: --backend must be one of ${BACKEND_NAMES.join(', ')}; got "${backend}"`,
    );
  }
  const loadMode = text(parsed, 'load-mode') ?? 'ondemand';
  if (loadMode !== 'ondemand' && loadMode !== 'eager' && loadMode !== 'tar') {
    throw new UsageError(`sandgym run: --load-mode must be ondemand, eager or tar; got "${loadMode}"`);
  }
  const json = await jsonOutput(parsed);
  await using platform = await openPlatform({ loadMode });
  // A signal to the CLI tears the sandbox down before exiting.
  const onSignal = (): void => {
    void platform.close().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const started = performance.now();
  await using sandbox = await platform.createSandbox({
    backend: backend as 'container',
    ...(environment ? { environment } : {}),
    ...(memoryMib ? { resources: { memoryMib } } : {}),
  });
  const createMs = performance.now() - started;
  const options = timeoutMs ? { timeoutMs } : {};
  if (json) {
    const result = await sandbox.exec(argv, options);
    await json.write({ sandbox: sandbox.id, backend: sandbox.backend, command: argv, createMs, ...result });
    return result.exitCode === 0 ? EXIT.ok : EXIT.failed;
  }
  const running = sandbox.execStream(argv, options);
  for await (const chunk of running.output)
    (chunk.stream === 'stdout' ? process.stdout : process.stderr).write(chunk.data);
  const result = await running.result;
  const notes = [
    result.timedOut ? `timed out after ${timeoutMs} ms` : '',
    result.oomKilled ? 'killed by the OOM killer at the memory limit' : '',
    result.stdoutTruncated || result.stderrTruncated ? 'output truncated at the cap' : '',
  ].filter(Boolean);
  console.error(
    `sandgym: exit ${result.exitCode ?? result.signal}${notes.length ? ` (${notes.join('; ')})` : ''} in ${result.durationMs.toFixed(1)} ms`,
  );
  return result.exitCode === 0 ? EXIT.ok : EXIT.failed;
}
