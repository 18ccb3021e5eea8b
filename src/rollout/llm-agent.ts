import { messageOf, parseAt, secretRedactor } from '../common/index.ts';
import { sandboxActionSchema, type SandboxAction, type TaskObservation } from '../env/index.ts';
import type { Agent, AgentDecision } from './agent-types.ts';
import type { TokenUsage } from './episode-report.ts';
import { askModel, type Completion, type ModelRequest } from './model-endpoint.ts';
import { observationText } from './observation-text.ts';

/** Options for {@link openAiAgent}. */
export interface OpenAiAgentOptions {
  /** The model name the endpoint knows. */
  model: string;
  /** The API root, e.g. `http://127.0.0.1:8000/v1`: requests go to `<baseUrl>/chat/completions`. */
  baseUrl: string;
  /** Sent as a bearer token when given. */
  apiKey?: string;
  /** What the model is told before the task. */
  systemPrompt?: string;
  temperature?: number;
  /**
   * For each answer, whole: a model that takes longer (a long generation) fails its episode,
   * scored 0. Default 120 s.
   */
  requestTimeoutMs?: number;
}

/** The env's actions as chat-completions tools. */
const TOOLS = [
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

function tool(name: string, description: string, properties: Record<string, unknown>, required: string[]) {
  return {
    type: 'function' as const,
    function: {
      name,
      description,
      parameters: { type: 'object', properties, required, additionalProperties: false },
    },
  };
}

const DEFAULT_SYSTEM_PROMPT =
  'You are an agent working in a Linux sandbox to complete a task. Act only through the tools, one call at a time, and call submit when the task is done.';

type ToolCall = NonNullable<Completion['choices'][number]['message']['tool_calls']>[number];

type ChatMessage =
  | { role: 'system' | 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string };

/** The action a tool call asks for, or why it cannot be one (told to the model). */
function actionOf(call: ToolCall): SandboxAction | { error: string } {
  let args: Record<string, unknown>;
  try {
    args = JSON.parse(call.function.arguments || '{}') as Record<string, unknown>;
  } catch (error) {
    return { error: `the arguments are not JSON: ${messageOf(error)}` };
  }
  const { timeout_ms: timeoutMs, ...rest } = args;
  try {
    const asked = { type: call.function.name, ...rest, ...(timeoutMs === undefined ? {} : { timeoutMs }) };
    return parseAt(sandboxActionSchema, asked, `${call.function.name} call`);
  } catch (error) {
    return { error: messageOf(error) };
  }
}

/** Times a model may answer without a usable tool call before the agent submits for it. */
const MAX_NUDGES = 3;
/** Conversations kept at once (one per running episode). */
const MAX_CONVERSATIONS = 4096;

/**
 * An agent that drives any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp,
 * the OpenAI API) with tool calling: the env's actions are its tools, each observation goes back
 * as the tool's result, and the tokens each decision cost are recorded with the step. Each answer
 * is read bounded, checked and stripped of the API key (see askModel); an unusable one is the
 * agent's failure (an AgentError), scored 0.
 */
export function openAiAgent(options: OpenAiAgentOptions): () => Agent {
  const url = `${options.baseUrl.replace(/\/+$/, '')}/chat/completions`;
  const redactor = secretRedactor([options.apiKey]);
  const ask = (messages: ChatMessage[]): Promise<Completion> => {
    const request: ModelRequest = {
      url,
      body: {
        model: options.model,
        messages,
        tools: TOOLS,
        tool_choice: 'auto',
        ...(options.temperature === undefined ? {} : { temperature: options.temperature }),
      },
      timeoutMs: options.requestTimeoutMs ?? 120_000,
      redactor,
      ...(options.apiKey ? { apiKey: options.apiKey } : {}),
    };
    return askModel(request);
  };
  return () => {
    const conversations = new Map<string, { messages: ChatMessage[]; pending?: string }>();
    return async (observation, context): Promise<AgentDecision> => {
      let conversation = conversations.get(context.episodeId);
      if (!conversation) {
        conversation = {
          messages: [{ role: 'system', content: options.systemPrompt ?? DEFAULT_SYSTEM_PROMPT }],
        };
        conversations.set(context.episodeId, conversation);
        if (conversations.size > MAX_CONVERSATIONS)
          conversations.delete(conversations.keys().next().value ?? '');
      }
      answerPending(conversation, observation);
      const usage: TokenUsage = { promptTokens: 0, completionTokens: 0 };
      for (let nudge = 0; nudge <= MAX_NUDGES; nudge++) {
        const completion = await ask(conversation.messages);
        usage.promptTokens += completion.usage?.prompt_tokens ?? 0;
        usage.completionTokens += completion.usage?.completion_tokens ?? 0;
        const message = completion.choices[0]!.message;
        const calls = message.tool_calls ?? [];
        conversation.messages.push({
          role: 'assistant',
          content: message.content ?? null,
          ...(calls.length ? { tool_calls: calls } : {}),
        });
        const [first, ...others] = calls;
        // one action per step: every other call of the answer is told it did not run
        for (const other of others)
          conversation.messages.push({
            role: 'tool',
            tool_call_id: other.id,
            content: 'Not run: one tool call per turn.',
          });
        if (!first) {
          conversation.messages.push({
            role: 'user',
            content: 'Act through a tool call; call submit when the task is done.',
          });
          continue;
        }
        const action = actionOf(first);
        if ('error' in action) {
          conversation.messages.push({
            role: 'tool',
            tool_call_id: first.id,
            content: `Invalid call: ${action.error}`,
          });
          continue;
        }
        conversation.pending = first.id;
        if (action.type === 'submit') conversations.delete(context.episodeId);
        return { action, usage, ...(message.content ? { message: message.content } : {}) };
      }
      conversations.delete(context.episodeId);
      return {
        action: { type: 'submit' },
        usage,
        message: `no usable tool call after ${MAX_NUDGES + 1} answers`,
      };
    };
  };
}

/** Puts what the env answered where the model expects it: the task as the user's, a result as the tool's. */
function answerPending(
  conversation: { messages: ChatMessage[]; pending?: string },
  observation: TaskObservation,
): void {
  if (observation.type === 'task') {
    conversation.messages.push({ role: 'user', content: observation.instruction });
    return;
  }
  if (conversation.pending) {
    conversation.messages.push({
      role: 'tool',
      tool_call_id: conversation.pending,
      content: observationText(observation),
    });
    delete conversation.pending;
  }
}
