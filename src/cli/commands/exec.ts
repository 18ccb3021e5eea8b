import { constants } from 'node:os';
import type { ExecOptions } from '../../backends/index.ts';
import { MAX_COMMAND_TIMEOUT_MS } from '../../platform/index.ts';
import { flag, numberOf, text } from '../args.ts';
import { parseCommand, type CommandSpec } from '../command-spec.ts';
import { UsageError } from '../exit-codes.ts';
import { reachSandbox } from './reach-sandbox.ts';

export const EXEC_COMMAND = {
  name: 'exec',
  summary: 'a command in a sandbox create made, its output as it comes; exits with its exit code',
  operands: 'ID -- CMD ...',
  takesCommandLine: true,
  details:
    "CMD is an argv (no shell is added). The exit code is the command's (128 + the signal's number\n" +
    'when a signal ended it); an unknown id is 2. The sandbox stays.',
  options: {
    'timeout-ms': {
      type: 'integer',
      range: [1, MAX_COMMAND_TIMEOUT_MS],
      description: "the command's time limit",
    },
    cwd: { type: 'string', value: 'DIR', description: 'where it runs' },
    user: { type: 'string', value: 'USER', description: 'who runs it (default root)' },
    stdin: { type: 'boolean', description: "pass this command's stdin to it (read in full first)" },
  },
} as const satisfies CommandSpec;

/**
 * `sandgym exec [--timeout-ms N] [--cwd DIR] [--user USER] [--stdin] ID -- CMD ...`: runs CMD (an
 * argv, no shell added) in a live sandbox, its output streamed as it comes, and exits with its
 * exit code (128 + the signal's number when a signal ended it). The sandbox stays.
 */
export async function execCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(EXEC_COMMAND, args);
  const [id, ...rest] = parsed.positionals;
  const argv = parsed.commandLine.length ? parsed.commandLine : rest;
  if (!id || argv.length === 0 || !argv[0]) {
    throw new UsageError('sandgym exec: give a sandbox id and a command, e.g. sandgym exec ID -- ls -l /');
  }
  const timeoutMs = numberOf(parsed, 'timeout-ms');
  const cwd = text(parsed, 'cwd');
  const user = text(parsed, 'user');
  const stdin = flag(parsed, 'stdin') ? await readAll(process.stdin) : undefined;
  await using reached = await reachSandbox(id);
  // a signal to this command stops the command in the sandbox, not the sandbox
  const interrupt = new AbortController();
  const onSignal = (): void => interrupt.abort();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const options: ExecOptions = {
    signal: interrupt.signal,
    ...(timeoutMs ? { timeoutMs } : {}),
    ...(cwd ? { cwd } : {}),
    ...(user ? { user } : {}),
    ...(stdin ? { stdin } : {}),
  };
  try {
    const running = reached.sandbox.execStream(argv, options);
    for await (const chunk of running.output) {
      if (chunk.stream !== 'report')
        (chunk.stream === 'stdout' ? process.stdout : process.stderr).write(chunk.data);
    }
    const result = await running.result;
    if (result.timedOut) console.error(`sandgym exec: timed out after ${timeoutMs} ms`);
    if (result.oomKilled) console.error('sandgym exec: killed by the OOM killer at the memory limit');
    if (result.stdoutTruncated || result.stderrTruncated)
      console.error("sandgym exec: output truncated at the sandbox's cap");
    if (result.exitCode !== null) return result.exitCode;
    const signal = result.signal as keyof typeof constants.signals | null;
    return 128 + ((signal && constants.signals[signal]) || 0);
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

async function readAll(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(Buffer.from(chunk as Buffer));
  return Buffer.concat(chunks);
}
