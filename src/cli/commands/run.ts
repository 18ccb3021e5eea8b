import { BACKEND_NAMES } from '../../backends/index.ts';
import { openPlatform } from './cluster.ts';
import { parseCommandArgs, positiveInt, splitAtDoubleDash, text } from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/** `sandgym run [--backend B] [--env E] [--load-mode M] [--json] -- CMD ...`: one sandbox, one command, then teardown. */
export async function runCommand(args: string[]): Promise<number> {
  const { before, after: command } = splitAtDoubleDash(args);
  const parsed = parseCommandArgs('run', before, {
    backend: { type: 'string', default: 'container' },
    env: { type: 'string' },
    json: { type: 'boolean' },
    'timeout-ms': { type: 'string' },
    'memory-mib': { type: 'string' },
    'load-mode': { type: 'string' },
  });
  const argv = command.length ? command : parsed.positionals;
  if (argv.length === 0 || !argv[0]) {
    throw new UsageError('sandgym run: the command is empty; give one after --, e.g. sandgym run -- echo hi');
  }
  const memoryMib = positiveInt('memory-mib', text(parsed, 'memory-mib'));
  const timeoutMs = positiveInt('timeout-ms', text(parsed, 'timeout-ms'));
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
  if (parsed.values['json']) {
    const result = await sandbox.exec(argv, options);
    console.log(
      JSON.stringify({ sandbox: sandbox.id, backend: sandbox.backend, command: argv, createMs, ...result }),
    );
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
