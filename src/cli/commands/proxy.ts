import { ModelProxy } from '../../rollout/index.ts';
import { durationMs, listenAddress, text } from '../args.ts';
import { parseCommand, type CommandSpec } from '../command-spec.ts';
import { UsageError } from '../exit-codes.ts';
import { serveUntilSignalled } from './cluster.ts';

export const PROXY_COMMAND = {
  name: 'proxy',
  summary: 'an OpenAI-compatible recording proxy for agents with their own loop',
  details:
    'Each chat completion (streamed or not) passes through and is appended to DIR/turns.jsonl with\n' +
    'its token ids and logprobs. The upstream key comes from $SANDGYM_LLM_API_KEY.',
  options: {
    upstream: { type: 'string', value: 'URL', description: 'the API root, e.g. http://127.0.0.1:8000/v1' },
    out: { type: 'string', value: 'DIR', description: 'where turns.jsonl is kept' },
    listen: {
      type: 'string',
      value: 'HOST:PORT',
      description: 'where it listens (default loopback, a free port)',
    },
    timeout: { type: 'string', value: 'DURATION', description: 'how long an answer may take, e.g. 10m' },
  },
} as const satisfies CommandSpec;

/**
 * `sandgym proxy --upstream URL [--listen 127.0.0.1:PORT] --out DIR [--timeout 10m]`: a recording
 * OpenAI-compatible proxy for agents with their own loop (see ModelProxy). The key it adds
 * upstream comes from $SANDGYM_LLM_API_KEY; without it the client's own goes through.
 */
export async function proxyCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(PROXY_COMMAND, args);
  const upstream = text(parsed, 'upstream');
  const outDir = text(parsed, 'out');
  if (!upstream || !outDir)
    throw new UsageError(
      'sandgym proxy: give --upstream URL (the API root, e.g. http://127.0.0.1:8000/v1) and --out DIR',
    );
  const answerTimeoutMs = durationMs('timeout', text(parsed, 'timeout'));
  const listen = text(parsed, 'listen');
  const { host, port } =
    listen === undefined ? { host: '', port: undefined } : listenAddress('listen', listen);
  const apiKey = process.env['SANDGYM_LLM_API_KEY'];
  const proxy = await ModelProxy.start({
    upstream,
    outDir,
    ...(host ? { host } : {}),
    ...(port === undefined ? {} : { port }),
    ...(apiKey ? { apiKey } : {}),
    ...(answerTimeoutMs === undefined ? {} : { answerTimeoutMs }),
  });
  console.error(`sandgym proxy: listening on ${proxy.url}, recording each call to ${outDir}/turns.jsonl`);
  return serveUntilSignalled(() => proxy.close());
}
