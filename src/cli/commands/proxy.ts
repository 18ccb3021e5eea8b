import { ModelProxy } from '../../rollout/index.ts';
import { durationMs, parseCommandArgs, text } from '../args.ts';
import { UsageError } from '../exit-codes.ts';
import { serveUntilSignalled } from './cluster.ts';

/** `--listen HOST:PORT`, `[::1]:PORT` or `:PORT` (loopback); undefined parts take the defaults. */
function listenAddress(listen: string | undefined): { host?: string; port?: number } {
  if (listen === undefined) return {};
  const match = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(listen);
  const port = Number(match?.[3]);
  if (!match || port > 65_535)
    throw new UsageError(
      `sandgym proxy: --listen takes HOST:PORT (port 0 picks a free one), got "${listen}"`,
    );
  const host = match[1] ?? match[2];
  return { ...(host ? { host } : {}), port };
}

/**
 * `sandgym proxy --upstream URL [--listen 127.0.0.1:PORT] --out DIR [--timeout 10m]`: a recording
 * OpenAI-compatible proxy for agents with their own loop (see ModelProxy). The key it adds
 * upstream comes from $SANDGYM_LLM_API_KEY; without it the client's own goes through.
 */
export async function proxyCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('proxy', args, {
    upstream: { type: 'string' },
    listen: { type: 'string' },
    out: { type: 'string' },
    timeout: { type: 'string' },
  });
  const upstream = text(parsed, 'upstream');
  const outDir = text(parsed, 'out');
  if (!upstream || !outDir)
    throw new UsageError(
      'sandgym proxy: give --upstream URL (the API root, e.g. http://127.0.0.1:8000/v1) and --out DIR',
    );
  const answerTimeoutMs = durationMs('timeout', text(parsed, 'timeout'));
  const apiKey = process.env['SANDGYM_LLM_API_KEY'];
  const proxy = await ModelProxy.start({
    upstream,
    outDir,
    ...listenAddress(text(parsed, 'listen')),
    ...(apiKey ? { apiKey } : {}),
    ...(answerTimeoutMs === undefined ? {} : { answerTimeoutMs }),
  });
  console.error(`sandgym proxy: listening on ${proxy.url}, recording each call to ${outDir}/turns.jsonl`);
  return serveUntilSignalled(() => proxy.close());
}
