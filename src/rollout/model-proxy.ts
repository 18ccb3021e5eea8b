import { open, mkdir, type FileHandle } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { isIP, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { z } from 'zod';
import { SandgymError, issuesText, messageOf, secretRedactor, type Redactor } from '../common/index.ts';
import { CompletionStream } from './completion-stream.ts';
import { MAX_ANSWER_BYTES, completionSchema, describe, readUpTo } from './model-endpoint.ts';
import { keptResponse, usageAndTokensOf, type ModelTurn } from './model-turn.ts';

/** The largest request a client may send through (a long conversation is megabytes, not more). */
const MAX_REQUEST_BYTES = 32 * 1024 * 1024;

/** Options for {@link ModelProxy.start}. */
export interface ModelProxyOptions {
  /** The upstream's API root, e.g. `http://127.0.0.1:8000/v1`. */
  upstream: string;
  /** Where `turns.jsonl` is written (appended to). */
  outDir: string;
  /** A loopback host to listen on; default 127.0.0.1. */
  host?: string;
  /** Default 0: any free port (see {@link ModelProxy.url}). */
  port?: number;
  /** Sent upstream as the bearer token; without it, the client's own Authorization goes through. */
  apiKey?: string;
  /** For each answer, whole (a stream included); default 600 s. */
  answerTimeoutMs?: number;
}

/** The request fields the proxy reads; the rest goes upstream as sent. */
const requestSchema = z.looseObject({
  model: z.string().max(1024),
  messages: z.array(z.unknown()).min(1, 'give at least one message').max(100_000),
  stream: z.boolean().optional(),
});

/** Whether `host` is a loopback address: the only kind the proxy binds. */
function isLoopback(host: string): boolean {
  if (host === 'localhost') return true;
  if (isIP(host) === 4) return host.startsWith('127.');
  return host === '::1';
}

/**
 * An OpenAI-compatible recording proxy for agents that bring their own loop: each POST of
 * `/v1/chat/completions` (streaming or not) goes to the upstream, its answer comes back to the
 * client as the upstream sent it, and one {@link ModelTurn} per call is appended to
 * `<outDir>/turns.jsonl`: the request, the answer (a stream assembled), usage, token ids and
 * logprobs, and what was wrong with it. The upstream is untrusted: its answer is read within
 * {@link MAX_ANSWER_BYTES} and the time limit, and checked by the model agent's schema; an answer
 * past either is cut off (a 502, or a stream ended early) and recorded as such. It binds loopback
 * only, and the key it adds is in no record.
 *
 * @example
 * ```ts
 * await using proxy = await ModelProxy.start({ upstream: 'http://127.0.0.1:8000/v1', outDir: 'turns' });
 * console.log(`point the agent at ${proxy.url}`);
 * ```
 */
export class ModelProxy {
  private writes: Promise<void> = Promise.resolve();
  private state: 'open' | 'closing' | 'closed' = 'open';

  private constructor(
    private readonly server: Server,
    private readonly file: FileHandle,
    private readonly options: ModelProxyOptions,
    /** The API root clients are given: `http://HOST:PORT/v1`. */
    readonly url: string,
  ) {}

  /** Listens on a loopback address; refuses any other. */
  static async start(options: ModelProxyOptions): Promise<ModelProxy> {
    const host = options.host ?? '127.0.0.1';
    if (!isLoopback(host))
      throw new SandgymError(
        'invalid_argument',
        `The proxy listens on loopback only (127.0.0.1, ::1, localhost), not ${host}: its clients' requests and the key it adds must not be reachable from the network`,
      );
    let upstream: URL;
    try {
      upstream = new URL(options.upstream);
    } catch {
      throw new SandgymError('invalid_argument', `--upstream is not a URL: ${options.upstream}`);
    }
    if (upstream.protocol !== 'http:' && upstream.protocol !== 'https:')
      throw new SandgymError(
        'invalid_argument',
        `--upstream must be an http(s) URL, not ${upstream.protocol}`,
      );
    await mkdir(options.outDir, { recursive: true });
    const file = await open(join(options.outDir, 'turns.jsonl'), 'a');
    const server = createServer();
    await new Promise<void>((done, fail) => {
      server.once('error', fail);
      server.listen(options.port ?? 0, host, () => done());
    });
    const { port } = server.address() as AddressInfo;
    const shown = host.includes(':') ? `[${host}]` : host;
    const proxy = new ModelProxy(server, file, options, `http://${shown}:${port}/v1`);
    server.on('request', (req, res) => {
      proxy.handle(req, res).catch((error: unknown) => {
        if (!res.headersSent) answerError(res, 500, `The proxy failed: ${messageOf(error)}`);
        else res.destroy();
      });
    });
    return proxy;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? '/', 'http://proxy').pathname.replace(/\/+$/, '');
    if (req.method !== 'POST' || !path.endsWith('/chat/completions'))
      return answerError(res, 404, 'The proxy serves POST /v1/chat/completions only');
    const { bytes, overflowed } = await readBody(req, MAX_REQUEST_BYTES);
    if (overflowed) return answerError(res, 413, `The request is larger than ${MAX_REQUEST_BYTES} bytes`);
    let body: unknown;
    try {
      body = JSON.parse(bytes.toString('utf8'));
    } catch (error) {
      return answerError(res, 400, `The request is not JSON: ${messageOf(error)}`);
    }
    const parsed = requestSchema.safeParse(body);
    if (!parsed.success)
      return answerError(res, 400, `The request is not a chat completion: ${issuesText(parsed.error)}`);
    const clientAuthorization = req.headers.authorization;
    const redactor = secretRedactor([this.options.apiKey, clientAuthorization?.replace(/^Bearer\s+/i, '')]);
    const authorization = this.options.apiKey ? `Bearer ${this.options.apiKey}` : clientAuthorization;
    const startedAt = new Date();
    const turn = await this.forward(parsed.data, authorization, res, redactor);
    this.record({
      startedAt: startedAt.toISOString(),
      durationMs: Date.now() - startedAt.getTime(),
      request: redactor.value(parsed.data),
      ...turn,
    });
  }

  /** Sends the request upstream and the answer back; returns what the record says of the answer. */
  private async forward(
    request: z.infer<typeof requestSchema>,
    authorization: string | undefined,
    res: ServerResponse,
    redactor: Redactor,
  ): Promise<Partial<ModelTurn>> {
    const timeoutMs = this.options.answerTimeoutMs ?? 600_000;
    const gone = new AbortController();
    res.once('close', () => gone.abort());
    const signal = AbortSignal.any([AbortSignal.timeout(timeoutMs), gone.signal]);
    const slow = `The upstream did not finish its answer within ${timeoutMs} ms`;
    let response: Response;
    try {
      response = await fetch(`${this.options.upstream.replace(/\/+$/, '')}/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) },
        body: JSON.stringify(request),
        signal,
      });
    } catch (error) {
      const message = signal.aborted
        ? slow
        : `The upstream cannot be reached: ${redactor.text(describe(error))}`;
      answerError(res, 502, message);
      return { error: message };
    }
    if (request.stream && response.ok) return this.relayStream(response, res, signal, slow, redactor);
    let read;
    try {
      read = await readUpTo(response, MAX_ANSWER_BYTES);
    } catch (error) {
      const message = signal.aborted
        ? slow
        : `The upstream's answer broke off: ${redactor.text(describe(error))}`;
      answerError(res, 502, message);
      return { status: response.status, error: message };
    }
    if (read.overflowed) {
      const message = `The upstream's answer is larger than ${MAX_ANSWER_BYTES} bytes: it was cut off`;
      answerError(res, 502, message);
      return { status: response.status, error: message };
    }
    // what the upstream said goes back as it said it: the client judges its own answers
    res.writeHead(response.status, {
      'content-type': response.headers.get('content-type') ?? 'application/json',
    });
    res.end(read.bytes);
    let raw: unknown;
    try {
      raw = JSON.parse(read.bytes.toString('utf8'));
    } catch (error) {
      return { status: response.status, error: `The answer is not JSON: ${messageOf(error)}` };
    }
    return { status: response.status, ...this.checked(redactor.value(raw), response.ok) };
  }

  /** Passes a stream through as it comes, assembling it for the record; cuts it at the caps. */
  private async relayStream(
    response: Response,
    res: ServerResponse,
    signal: AbortSignal,
    slow: string,
    redactor: Redactor,
  ): Promise<Partial<ModelTurn>> {
    res.writeHead(response.status, {
      'content-type': response.headers.get('content-type') ?? 'text/event-stream',
    });
    const stream = new CompletionStream();
    const decoder = new TextDecoder();
    const reader: ReadableStreamDefaultReader<Uint8Array> | undefined = response.body?.getReader();
    let size = 0;
    let error: string | undefined;
    try {
      for (;;) {
        const next = await reader?.read();
        if (!next || next.done) break;
        size += next.value.byteLength;
        if (size > MAX_ANSWER_BYTES) {
          error = `The upstream's stream is larger than ${MAX_ANSWER_BYTES} bytes: it was cut off`;
          break;
        }
        res.write(next.value);
        stream.push(decoder.decode(next.value, { stream: true }));
      }
    } catch (caught) {
      error = signal.aborted ? slow : `The upstream's stream broke off: ${redactor.text(describe(caught))}`;
    }
    if (error) {
      await reader?.cancel().catch(() => undefined);
      // the client must see the answer is incomplete: no [DONE], the connection dropped
      res.destroy();
    } else res.end();
    const checked = this.checked(redactor.value(stream.completion()), true);
    const problems = [
      ...(error ? [error] : []),
      ...(stream.isDone || error ? [] : ['the stream ended without [DONE]']),
      ...stream.problems,
      ...(checked.error ? [checked.error] : []),
    ];
    return {
      status: response.status,
      ...checked,
      ...(problems.length ? { error: problems.join('; ') } : {}),
    };
  }

  /** The record of an answer: checked by the model agent's schema, its tokens taken out. */
  private checked(raw: unknown, isOk: boolean): Partial<ModelTurn> {
    const kept = keptResponse(raw);
    if (!isOk) return { ...kept, error: 'the upstream refused the request' };
    const parsed = completionSchema.safeParse(raw);
    if (!parsed.success)
      return { ...kept, error: `The answer is not a usable chat completion: ${issuesText(parsed.error)}` };
    const completion = parsed.data;
    const choice = completion.choices[0]!;
    const calls = choice.message.tool_calls ?? [];
    return {
      ...kept,
      ...usageAndTokensOf(completion),
      ...(calls.length ? { toolCalls: calls.map((call) => ({ ...call.function, id: call.id })) } : {}),
    };
  }

  /** Appends a record, one line, in the order calls finished. */
  private record(turn: ModelTurn): void {
    const line = `${JSON.stringify(turn)}\n`;
    this.writes = this.writes.then(() => this.file.appendFile(line)).catch(() => undefined);
  }

  /** Stops taking calls, lets those under way finish, and closes the record file. Idempotent. */
  async close(): Promise<void> {
    if (this.state !== 'open') return;
    this.state = 'closing';
    await new Promise<void>((done) => this.server.close(() => done()));
    await this.writes;
    await this.file.close();
    this.state = 'closed';
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** An error in OpenAI's shape, which its clients show. */
function answerError(res: ServerResponse, status: number, message: string): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { message, type: 'sandgym_proxy_error', code: status } }));
}

/** Up to `maxBytes` of a request's body; `overflowed` when there was more (the rest is not read). */
async function readBody(
  req: IncomingMessage,
  maxBytes: number,
): Promise<{ bytes: Buffer; overflowed: boolean }> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > maxBytes) return { bytes: Buffer.alloc(0), overflowed: true };
    chunks.push(chunk);
  }
  return { bytes: Buffer.concat(chunks), overflowed: false };
}
