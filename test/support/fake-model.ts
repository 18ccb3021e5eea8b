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
    prompt_token_ids: promptIds,
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
        token_ids: ids,
        logprobs: { content: ids.map((id, i) => ({ token: `token_id:${id}`, logprob: -i / 100 })) },
      },
    ],
    usage: { prompt_tokens: promptIds.length, completion_tokens: ids.length, total_tokens: 0 },
  };
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
