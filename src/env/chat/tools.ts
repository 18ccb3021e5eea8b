import { messageOf, parseAt } from '../../common/index.ts';
import { sandboxActionSchema, type SandboxAction } from '../../platform/index.ts';

/** A tool as chat-completions APIs (and chat templates) take it: a function with JSON-schema parameters. */
export interface ChatTool {
  type: 'function';
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

function tool(
  name: string,
  description: string,
  properties: Record<string, unknown>,
  required: string[],
): ChatTool {
  return {
    type: 'function',
    function: {
      name,
      description,
      parameters: { type: 'object', properties, required, additionalProperties: false },
    },
  };
}

/**
 * The env's actions as chat tools: what the OpenAI-compatible agent gives its model and what the
 * chat env tells a trainer's, so both act through the same calls.
 */
export const CHAT_TOOLS: readonly ChatTool[] = [
  tool(
    'exec',
    'Run a shell command in the sandbox; returns its output and exit code.',
    {
      command: { type: 'string', description: 'A shell line, run with /bin/sh -c' },
      cwd: { type: 'string', description: 'Absolute working directory' },
      timeout_ms: { type: 'integer', description: 'Time limit in milliseconds' },
    },
    ['command'],
  ),
  tool(
    'write_file',
    'Write a text file (parent folders are created).',
    {
      path: { type: 'string', description: 'Absolute path' },
      content: { type: 'string' },
    },
    ['path', 'content'],
  ),
  tool('read_file', 'Read a text file.', { path: { type: 'string', description: 'Absolute path' } }, [
    'path',
  ]),
  tool('list_dir', 'List a folder.', { path: { type: 'string', description: 'Absolute path' } }, ['path']),
  tool('submit', 'Finish: the task is done (or cannot be done). Grading follows.', {}, []),
];

/** The names of the chat tools. */
export const CHAT_TOOL_NAMES: ReadonlySet<string> = new Set(CHAT_TOOLS.map((t) => t.function.name));

/** The most of a refusal's text a model is told (a call with 100,000 bad fields has as many issues). */
const MAX_PROBLEM_CHARS = 2048;

/**
 * The action a call of tool `name` with the arguments `args` (a JSON object) asks for, or why it
 * cannot be one, in words for the model. Tool arguments are snake_case (`timeout_ms`), actions
 * camelCase.
 */
export function actionOfToolCall(
  name: string,
  args: Record<string, unknown>,
): SandboxAction | { error: string } {
  if (!CHAT_TOOL_NAMES.has(name))
    return {
      error: `there is no tool "${name.slice(0, 200)}"; the tools are ${[...CHAT_TOOL_NAMES].join(', ')}`,
    };
  const { timeout_ms: timeoutMs, ...rest } = args;
  try {
    // the tool names the action, whatever `type` its arguments carry
    const asked = { ...rest, type: name, ...(timeoutMs === undefined ? {} : { timeoutMs }) };
    return parseAt(sandboxActionSchema, asked, `${name} call`);
  } catch (error) {
    const message = messageOf(error);
    return {
      error: message.length > MAX_PROBLEM_CHARS ? `${message.slice(0, MAX_PROBLEM_CHARS)}…` : message,
    };
  }
}
