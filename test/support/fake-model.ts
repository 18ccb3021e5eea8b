import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** A chat-completions request as a fake model reads it. */
export interface ChatRequest {
  model: string;
  messages: { role: string; content?: string | null; tool_call_id?: string; tool_calls?: unknown[] }[];
  tools?: { function: { name: string } }[];
  stream?: boolean;
  [key: string]: unknown;
}

/** What a scripted model says in one answer. */
export interface FakeAnswer {
  content?: string | null;
  calls?: { id: string; name: string; arguments: string }[];
}

/**
 * The token ids a fake model gives an answer: its text's UTF-16 code units (a stand-in
 * tokenizer, deterministic, so a test can predict every id and logprob).
 */
export function fakeTokens(text: string): number[] {
  return [...text].map((char) => char.codePointAt(0)!);
}

function answerText(answer: FakeAnswer): string {
  return `${answer.content ?? ''}${(answer.calls ?? []).map((c) => c.name + c.arguments).join('')}`;
}

/** A chat completion as vLLM answers with `return_token_ids` and `logprobs`. */
export function completionOf(request: ChatRequest, answer: FakeAnswer): Record<string, unknown> {
  const ids = fakeTokens(answerText(answer));
  const promptIds = fakeTokens(request.messages.map((m) => m.content ?? '').join('|')).slice(0, 64);
  return {
    id: 'chatcmpl-fake',
    object: 'chat.completion',
    created: 0,
    model: request.model,
    ...(request['logprobs'] ? { prompt_token_ids: promptIds } : {}),
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: answer.content ?? null,
          ...(answer.calls?.length
            ? {
                tool_calls: answer.calls.map((c) => ({
                  id: c.id,
                  type: 'function',
                  function: { name: c.name, arguments: c.arguments },
                })),
              }
            : {}),
        },
        finish_reason: answer.calls?.length ? 'tool_calls' : 'stop',
        // as vLLM: only when asked
        ...(request['logprobs']
          ? {
              token_ids: ids,
              logprobs: { content: ids.map((id, i) => ({ token: `token_id:${id}`, logprob: -i / 100 })) },
            }
          : {}),
      },
    ],
    usage: { prompt_tokens: promptIds.length, completion_tokens: ids.length, total_tokens: 0 },
  };
}

/**
 * The same answer as vLLM streams it: content a few characters a chunk, each chunk with its
 * token ids and logprobs, the call's name then its arguments in two pieces, then usage (when
 * asked `stream_options.include_usage`) and `[DONE]`.
 */
export function streamOf(request: ChatRequest, answer: FakeAnswer): string {
  const whole = completionOf(request, answer) as {
    choices: { token_ids: number[]; logprobs: { content: unknown[] } }[];
    usage: unknown;
    prompt_token_ids: number[];
  };
  const [choice] = whole.choices;
  let at = 0;
  const tokens = (text: string) => {
    const slice = { token_ids: choice!.token_ids.slice(at, at + [...text].length) };
    const logprobs = { content: choice!.logprobs.content.slice(at, at + [...text].length) };
    at += [...text].length;
    return { ...slice, logprobs };
  };
  const chunk = (delta: unknown, text: string, extra: Record<string, unknown> = {}) =>
    `data: ${JSON.stringify({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', model: request.model, ...extra, choices: [{ index: 0, delta, ...tokens(text) }] })}\n\n`;
  const events = [
    chunk({ role: 'assistant', content: '' }, '', { prompt_token_ids: whole.prompt_token_ids }),
  ];
  const content = answer.content ?? '';
  for (let i = 0; i < content.length; i += 5)
    events.push(chunk({ content: content.slice(i, i + 5) }, content.slice(i, i + 5)));
  (answer.calls ?? []).forEach((call, index) => {
    const half = Math.floor(call.arguments.length / 2);
    events.push(
      chunk(
        {
          tool_calls: [
            { index, id: call.id, type: 'function', function: { name: call.name, arguments: '' } },
          ],
        },
        call.name,
      ),
    );
    events.push(
      chunk(
        { tool_calls: [{ index, function: { arguments: call.arguments.slice(0, half) } }] },
        call.arguments.slice(0, half),
      ),
    );
    events.push(
      chunk(
        { tool_calls: [{ index, function: { arguments: call.arguments.slice(half) } }] },
        call.arguments.slice(half),
      ),
    );
  });
  events.push(
    `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: answer.calls?.length ? 'tool_calls' : 'stop' }] })}\n\n`,
  );
  const options = request['stream_options'] as { include_usage?: boolean } | undefined;
  if (options?.include_usage) events.push(`data: ${JSON.stringify({ choices: [], usage: whole.usage })}\n\n`);
  return `${events.join('')}data: [DONE]\n\n`;
}

/** Answers a request, or takes over its response (a hostile endpoint). */
export type FakeModel = (request: ChatRequest, response: ServerResponse) => FakeAnswer | undefined;

/** A local chat-completions server on 127.0.0.1 playing `model`; it keeps every request. */
export async function startFakeModel(
  model: FakeModel,
): Promise<{ baseUrl: string; requests: ChatRequest[]; server: Server } & AsyncDisposable> {
  const requests: ChatRequest[] = [];
  const server = createServer((req: IncomingMessage, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => {
      const request = JSON.parse(body) as ChatRequest;
      requests.push(request);
      const answer = model(request, res);
      if (!answer) return;
      if (request.stream) {
        res.setHeader('content-type', 'text/event-stream');
        res.end(streamOf(request, answer));
        return;
      }
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(completionOf(request, answer)));
    });
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  return {
    baseUrl,
    requests,
    server,
    [Symbol.asyncDispose]: () =>
      new Promise<void>((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}
