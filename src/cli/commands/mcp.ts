import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { z } from 'zod';
import { messageOf } from '../../common/index.ts';
import { SandboxEnv, type SandboxAction } from '../../env/index.ts';
import { DEFAULT_ENVIRONMENT, type PlatformClient, type Sandbox } from '../../platform/index.ts';
import { observationText } from '../../rollout/index.ts';
import { text } from '../args.ts';
import { parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT } from '../exit-codes.ts';
import { SANDGYM_VERSION } from '../version.ts';
import { openPlatform } from './cluster.ts';
import { reachSandbox } from './reach-sandbox.ts';

const absolutePath = z.string().describe('An absolute path in the sandbox');

export const MCP_COMMAND = {
  name: 'mcp',
  summary: "a sandbox's actions (exec, write_file, read_file, list_dir) as MCP tools over stdio",
  details: 'A sandbox it made goes when the client does; one it attached to (--sandbox) stays.',
  options: {
    environment: {
      type: 'string',
      value: 'ENV',
      default: DEFAULT_ENVIRONMENT,
      description: 'make a sandbox of ENV',
    },
    sandbox: { type: 'string', value: 'ID', description: 'attach to this sandbox instead' },
    user: { type: 'string', value: 'USER', description: "act as USER (default the environment's USER)" },
  },
} as const satisfies CommandSpec;

/**
 * `sandgym mcp [--environment ENV | --sandbox ID] [--user USER]`: one sandbox's actions as MCP
 * tools over stdio, for an MCP client (an IDE, an agent framework). Each tool call is an env step:
 * run where the sandbox runs, as USER (default the environment's USER), audited, and kept in its
 * trajectory log. A sandbox it created is destroyed when the client goes away; one it attached to
 * (`--sandbox`) is left as it was found.
 */
export async function mcpCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(MCP_COMMAND, args);
  const attachTo = text(parsed, 'sandbox');
  // a sandbox to attach to is reached where it lives (on this host, through its holder)
  await using session: { platform: PlatformClient; sandbox?: Sandbox } & AsyncDisposable = attachTo
    ? await reachSandbox(attachTo)
    : await openPlatform().then((platform) => ({ platform, [Symbol.asyncDispose]: () => platform.close() }));
  const user = text(parsed, 'user');
  const as = user === undefined ? {} : { user };
  let env: SandboxEnv;
  if (session.sandbox) {
    env = await SandboxEnv.attach(session.platform, session.sandbox, `mcp-${Date.now().toString(36)}`, as);
  } else {
    env = SandboxEnv.create(session.platform, {
      sandbox: { environment: text(parsed, 'environment') ?? DEFAULT_ENVIRONMENT },
      ...as,
    });
    await env.reset();
  }
  const sandboxId = env.current!.id;
  const server = new McpServer({ name: 'sandgym', version: SANDGYM_VERSION });
  const act = async (action: SandboxAction) => {
    try {
      const { observation, outcome } = await env.step(action);
      const failed =
        outcome.kind !== 'ok' ||
        observation.type === 'error' ||
        (observation.type === 'exec' && observation.exitCode !== 0);
      return { content: [{ type: 'text' as const, text: observationText(observation) }], isError: failed };
    } catch (error) {
      return { content: [{ type: 'text' as const, text: messageOf(error) }], isError: true };
    }
  };
  server.registerTool(
    'exec',
    {
      description: `Run a shell command in sandbox ${sandboxId}; returns its output and exit code`,
      inputSchema: {
        command: z.string().describe('A shell line, run with /bin/sh -c'),
        cwd: absolutePath.optional(),
        timeout_ms: z.number().int().positive().optional().describe('Time limit in milliseconds'),
      },
    },
    ({ command, cwd, timeout_ms: timeoutMs }) =>
      act({ type: 'exec', command, ...(cwd ? { cwd } : {}), ...(timeoutMs ? { timeoutMs } : {}) }),
  );
  server.registerTool(
    'write_file',
    {
      description: 'Write a text file in the sandbox (parent folders are created)',
      inputSchema: { path: absolutePath, content: z.string() },
    },
    ({ path, content }) => act({ type: 'write_file', path, content }),
  );
  server.registerTool(
    'read_file',
    { description: 'Read a text file in the sandbox', inputSchema: { path: absolutePath } },
    ({ path }) => act({ type: 'read_file', path }),
  );
  server.registerTool(
    'list_dir',
    { description: 'List a folder in the sandbox', inputSchema: { path: absolutePath } },
    ({ path }) => act({ type: 'list_dir', path }),
  );
  const closed = new Promise<void>((resolve) => {
    server.server.onclose = resolve;
  });
  await server.connect(new StdioServerTransport());
  console.error(`sandgym mcp: serving sandbox ${sandboxId} over stdio`);
  // the client closed its end (or we were told to stop): the sandbox goes unless it was attached to
  const stop = (): void => void server.close();
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  process.stdin.once('end', stop);
  await closed;
  if (!attachTo) await env.close();
  return EXIT.ok;
}
