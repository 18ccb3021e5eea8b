import { messageOf } from '../common/index.ts';

interface ToolCallParts {
  id: string;
  name: string;
  arguments: string;
}

/** What one choice of a stream came to so far. */
interface ChoiceParts {
  content?: string;
  toolCalls: ToolCallParts[];
  tokenIds?: unknown[];
  logprobs?: unknown[];
  finishReason?: unknown;
}

type Loose = Record<string, unknown> | undefined;

function record(value: unknown): Loose {
  return value && typeof value === 'object' && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : undefined;
}

/** Appends `items` in place (a stream of one token a chunk stays linear; no spread of a huge list). */
function extend(target: unknown[], items: readonly unknown[]): void {
  for (const item of items) target.push(item);
}

/**
 * Reads a streamed chat completion (server-sent events of `chat.completion.chunk`s) as it goes by
 * and assembles the completion it amounts to: content and tool-call arguments concatenated,
 * calls by index, token ids and logprobs in order, usage from the chunk that has it. It never
 * throws: what it cannot read is kept in `problems`, and the assembled answer is checked by the
 * same schema as a whole one.
 */
export class CompletionStream {
  private pending = '';
  private readonly choices: ChoiceParts[] = [];
  private usage: unknown;
  private promptTokenIds: unknown;
  private meta: Record<string, unknown> = {};
  readonly problems: string[] = [];
  isDone = false;
  chunks = 0;

  /** Feeds the next piece of the stream's text. */
  push(text: string): void {
    this.pending += text.replace(/\r\n/g, '\n');
    let end = this.pending.indexOf('\n\n');
    while (end >= 0) {
      this.event(this.pending.slice(0, end));
      this.pending = this.pending.slice(end + 2);
      end = this.pending.indexOf('\n\n');
    }
  }

  private event(block: string): void {
    const data = block
      .split('\n')
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(5).trimStart())
      .join('\n');
    if (!data) return;
    if (data === '[DONE]') {
      this.isDone = true;
      return;
    }
    let chunk: Loose;
    try {
      chunk = record(JSON.parse(data));
    } catch (error) {
      this.problem(`chunk ${this.chunks + 1} is not JSON: ${messageOf(error)}`);
      return;
    }
    this.chunks++;
    if (!chunk) return this.problem(`chunk ${this.chunks} is not an object`);
    const { choices, usage, prompt_token_ids: promptTokenIds, ...meta } = chunk;
    if (this.chunks === 1) this.meta = meta;
    if (usage) this.usage = usage;
    if (promptTokenIds) this.promptTokenIds = promptTokenIds;
    if (choices !== undefined && !Array.isArray(choices))
      return this.problem(`chunk ${this.chunks}: choices is not a list`);
    for (const choice of (choices ?? []) as unknown[]) this.choice(record(choice));
  }

  private choice(choice: Loose): void {
    const index = typeof choice?.['index'] === 'number' ? choice['index'] : 0;
    if (!Number.isInteger(index) || index < 0 || index > 64)
      return this.problem(`a chunk names choice ${index}`);
    const parts = (this.choices[index] ??= { toolCalls: [] });
    const delta = record(choice?.['delta']);
    if (typeof delta?.['content'] === 'string') parts.content = (parts.content ?? '') + delta['content'];
    for (const call of Array.isArray(delta?.['tool_calls']) ? (delta['tool_calls'] as unknown[]) : []) {
      const given = record(call);
      const at = typeof given?.['index'] === 'number' ? given['index'] : parts.toolCalls.length;
      if (!Number.isInteger(at) || at < 0 || at > 64) return this.problem(`a chunk names tool call ${at}`);
      const known = (parts.toolCalls[at] ??= { id: '', name: '', arguments: '' });
      const fn = record(given?.['function']);
      if (typeof given?.['id'] === 'string') known.id += given['id'];
      if (typeof fn?.['name'] === 'string') known.name += fn['name'];
      if (typeof fn?.['arguments'] === 'string') known.arguments += fn['arguments'];
    }
    if (Array.isArray(choice?.['token_ids'])) extend((parts.tokenIds ??= []), choice['token_ids']);
    const logprobs = record(choice?.['logprobs'])?.['content'];
    if (Array.isArray(logprobs)) extend((parts.logprobs ??= []), logprobs);
    if (choice?.['finish_reason'] != null) parts.finishReason = choice['finish_reason'];
  }

  private problem(text: string): void {
    // a stream of junk keeps a few of its problems, not one per chunk
    if (this.problems.length < 10) this.problems.push(text);
  }

  /** The completion the chunks so far amount to, in the shape of a whole answer. */
  completion(): Record<string, unknown> {
    return {
      ...this.meta,
      object: 'chat.completion',
      choices: this.choices.map((parts, index) => ({
        index,
        message: {
          role: 'assistant',
          content: parts.content ?? null,
          ...(parts.toolCalls.length
            ? {
                tool_calls: parts.toolCalls.map((call) => ({
                  id: call.id,
                  type: 'function',
                  function: { name: call.name, arguments: call.arguments },
                })),
              }
            : {}),
        },
        ...(parts.finishReason === undefined ? {} : { finish_reason: parts.finishReason }),
        ...(parts.tokenIds ? { token_ids: parts.tokenIds } : {}),
        ...(parts.logprobs ? { logprobs: { content: parts.logprobs } } : {}),
      })),
      ...(this.usage === undefined ? {} : { usage: this.usage }),
      ...(this.promptTokenIds === undefined ? {} : { prompt_token_ids: this.promptTokenIds }),
    };
  }
}
