import { messageOf, secretRedactor, urlSecrets } from '../common/index.ts';
import {
  CHAT_TOOLS,
  CHAT_TOOL_NAMES,
  actionOfToolCall,
  type SandboxAction,
  type TaskObservation,
} from '../env/index.ts';
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

/** The env's actions as chat-completions tools: the chat env's, so both act alike. */
const TOOLS = CHAT_TOOLS;

const DEFAULT_SYSTEM_PROMPT =
  'You are an agent working in a Linux sandbox to complete a task. Act only through the tools, one call at a time, and call submit when the task is done.';

type ToolCall = NonNullable<Completion['choices'][number]['message']['tool_calls']>[number];

type ChatMessage =
  | { role: 'system' | 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string };

/** The names of the tools the model is given. */
const TOOL_NAMES = CHAT_TOOL_NAMES;

/**
 * A tool call as the conversation keeps it and sends back: its arguments a JSON object, or why
 * not. What goes back to the endpoint is only ever well-formed (arguments the canonical JSON of
 * an object, a name among the tools, a bounded id), so a malformed call the model made cannot make
 * the endpoint fail on the next request (a 5xx, which would be taken for infrastructure).
 */
interface ReadCall {
  echoed: ToolCall;
  args?: Record<string, unknown>;
  problem?: string;
}

function readCall(call: ToolCall, index: number): ReadCall {
  const id = call.id.length > 0 && call.id.length <= MAX_CALL_ID_CHARS ? call.id : `call_${index}`;
  const name = TOOL_NAMES.has(call.function.name) ? call.function.name : 'submit';
  const bad = (problem: string): ReadCall => ({
    echoed: { id, type: 'function', function: { name, arguments: '{}' } },
    problem,
  });
  if (!TOOL_NAMES.has(call.function.name))
    return bad(
      `there is no tool "${clip(call.function.name, 200)}"; the tools are ${[...TOOL_NAMES].join(', ')}`,
    );
  let args: unknown;
  try {
    args = JSON.parse(call.function.arguments || '{}');
  } catch (error) {
    return bad(`the arguments are not JSON: ${messageOf(error)}`);
  }
  // `null`, a number, a string or a list is JSON too, but no tool's arguments
  if (!args || typeof args !== 'object' || Array.isArray(args))
    return bad(
      `the arguments must be a JSON object, not ${Array.isArray(args) ? 'an array' : String(args === null ? 'null' : typeof args)}`,
    );
  // text no UTF-8 can hold (a lone surrogate, `\ud800`): sent back, it makes servers fail
  if (!wellFormed(args)) return bad('the arguments hold text that is not valid Unicode (a lone surrogate)');
  const text = JSON.stringify(args);
  return {
    echoed: {
      id,
      type: 'function',
      function: { name, arguments: text.length > MAX_MESSAGE_CHARS ? OMITTED_ARGUMENTS : text },
    },
    args: args as Record<string, unknown>,
  };
}

/** A UTF-16 surrogate without its other half. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Whether every string in a parsed JSON value (keys too) is valid Unicode. */
function wellFormed(value: unknown): boolean {
  if (typeof value === 'string') return !LONE_SURROGATE.test(value);
  if (Array.isArray(value)) return value.every(wellFormed);
  if (value && typeof value === 'object')
    return Object.entries(value).every(([key, inner]) => wellFormed(key) && wellFormed(inner));
  return true;
}

/** The action a tool call asks for, or why it cannot be one (told to the model). */
function actionOf(call: ReadCall): SandboxAction | { error: string } {
  if (!call.args) return { error: call.problem ?? 'unusable call' };
  return actionOfToolCall(call.echoed.function.name, call.args);
}

/** The longest tool-call id kept; a longer one is replaced. */
const MAX_CALL_ID_CHARS = 256;
/** The most of one message (an output, a model's words, a call's arguments) the conversation keeps. */
const MAX_MESSAGE_CHARS = 512 * 1024;
/**
 * The most the conversation holds in all: past it, the oldest outputs and arguments make way
 * (marked), so long outputs over many turns never grow a request past what can be sent (a
 * string past V8's limit is a RangeError) nor past any model's context.
 */
const MAX_CONVERSATION_CHARS = 8 * 1024 * 1024;
/** What stands for a call's arguments the conversation no longer holds. */
const OMITTED_ARGUMENTS = JSON.stringify({ omitted: 'arguments dropped to keep the conversation bounded' });
const DROPPED_OUTPUT = '[earlier output dropped to keep the conversation bounded]';

/** `text` cut to `chars`, its head and tail kept, with a marker saying how much went. */
function clip(text: string, chars: number): string {
  if (text.length <= chars) return text;
  const half = Math.floor(chars / 2);
  return `${text.slice(0, half)}\n…[${text.length - 2 * half} characters cut]…\n${text.slice(-half)}`;
}

function sizeOf(message: ChatMessage): number {
  const calls = 'tool_calls' in message ? (message.tool_calls ?? []) : [];
  return (message.content?.length ?? 0) + calls.reduce((sum, c) => sum + c.function.arguments.length, 0);
}

/**
 * Adds `message` to the conversation, cut to {@link MAX_MESSAGE_CHARS}, then makes the
 * conversation fit {@link MAX_CONVERSATION_CHARS}: the oldest outputs and call arguments go
 * first (the system prompt and the task stay).
 */
function append(conversation: Conversation, message: ChatMessage): void {
  const kept: ChatMessage =
    message.content && message.content.length > MAX_MESSAGE_CHARS
      ? { ...message, content: clip(message.content, MAX_MESSAGE_CHARS) }
      : message;
  conversation.messages.push(kept);
  conversation.chars += sizeOf(kept);
  for (const [index, old] of conversation.messages.entries()) {
    if (conversation.chars <= MAX_CONVERSATION_CHARS || index >= conversation.messages.length - 1) break;
    if (old.role === 'system' || (old.role === 'user' && index <= 1)) continue;
    const before = sizeOf(old);
    if (old.role === 'assistant')
      conversation.messages[index] = {
        ...old,
        content: old.content && old.content.length > DROPPED_OUTPUT.length ? DROPPED_OUTPUT : old.content,
        ...(old.tool_calls
          ? {
              tool_calls: old.tool_calls.map((c) => ({
                ...c,
                function: {
                  ...c.function,
                  arguments:
                    c.function.arguments.length > OMITTED_ARGUMENTS.length
                      ? OMITTED_ARGUMENTS
                      : c.function.arguments,
                },
              })),
            }
          : {}),
      };
    else if (old.content.length > DROPPED_OUTPUT.length)
      conversation.messages[index] = { ...old, content: DROPPED_OUTPUT };
    conversation.chars += sizeOf(conversation.messages[index]!) - before;
  }
}

interface Conversation {
  messages: ChatMessage[];
  /** What the messages hold, in characters (see sizeOf). */
  chars: number;
  pending?: string;
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
  // the key, and whatever credentials the URL itself carries
  const redactor = secretRedactor([options.apiKey, ...urlSecrets(options.baseUrl)]);
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
    const conversations = new Map<string, Conversation>();
    const agent: Agent = async (observation, context): Promise<AgentDecision> => {
      let conversation = conversations.get(context.episodeId);
      if (!conversation) {
        conversation = { messages: [], chars: 0 };
        append(conversation, { role: 'system', content: options.systemPrompt ?? DEFAULT_SYSTEM_PROMPT });
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
        const calls = (message.tool_calls ?? []).map(readCall);
        append(conversation, {
          role: 'assistant',
          content: message.content ?? null,
          ...(calls.length ? { tool_calls: calls.map((c) => c.echoed) } : {}),
        });
        const [first, ...others] = calls;
        // one action per step: every other call of the answer is told it did not run
        for (const other of others)
          append(conversation, {
            role: 'tool',
            tool_call_id: other.echoed.id,
            content: 'Not run: one tool call per turn.',
          });
        if (!first) {
          append(conversation, {
            role: 'user',
            content: 'Act through a tool call; call submit when the task is done.',
          });
          continue;
        }
        const action = actionOf(first);
        if ('error' in action) {
          append(conversation, {
            role: 'tool',
            tool_call_id: first.echoed.id,
            content: `Invalid call: ${action.error}`,
          });
          continue;
        }
        conversation.pending = first.echoed.id;
        if (action.type === 'submit') conversations.delete(context.episodeId);
        return {
          action,
          usage,
          ...(message.content ? { message: message.content } : {}),
        };
      }
      conversations.delete(context.episodeId);
      return {
        action: { type: 'submit' },
        usage,
        message: `no usable tool call after ${MAX_NUDGES + 1} answers`,
      };
    };
    // the rollout removes the key from whatever the episode produced, the sandbox's output too
    return Object.assign(agent, { redactor });
  };
}

/** Puts what the env answered where the model expects it: the task as the user's, a result as the tool's. */
function answerPending(conversation: Conversation, observation: TaskObservation): void {
  if (observation.type === 'task') {
    append(conversation, { role: 'user', content: observation.instruction });
    return;
  }
  if (conversation.pending) {
    append(conversation, {
      role: 'tool',
      tool_call_id: conversation.pending,
      content: observationText(observation),
    });
    delete conversation.pending;
  }
}
