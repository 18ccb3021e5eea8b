import { setTimeout as sleep } from 'node:timers/promises';
import { z } from 'zod';
import { SandgymError, issuesText, messageOf, type Redactor } from '../common/index.ts';
import { AgentError } from './agent-types.ts';
import { choiceTokensShape, promptTokensShape, usageSchema } from './model-turn.ts';

/** The largest answer read from a model endpoint: far above a real completion, far below memory trouble. */
export const MAX_ANSWER_BYTES = 16 * 1024 * 1024;
/** How much of an error's body is read, and how much of it a message shows. */
const MAX_ERROR_BODY_BYTES = 64 * 1024;
const ERROR_EXCERPT_CHARS = 300;
/** Tool calls one answer may make. */
const MAX_TOOL_CALLS = 64;
const MAX_ATTEMPTS = 3;

/**
 * Statuses that say this eval is set up wrong (its key, its permissions, the model's name, the
 * URL): no answer of the model's could cause them, and every episode would meet them.
 */
const CONFIGURATION_STATUSES = new Set([401, 403, 404, 407]);

/** What a chat-completions endpoint answers, as far as the agent reads it. */
export const completionSchema = z.object({
  choices: z
    .array(
      z.object({
        message: z.object({
          content: z.string().nullable().optional(),
          tool_calls: z
            .array(
              z.object({
                id: z.string(),
                type: z.literal('function').optional(),
                function: z.object({ name: z.string(), arguments: z.string() }),
              }),
            )
            .max(MAX_TOOL_CALLS)
            .nullable()
            .optional(),
        }),
        ...choiceTokensShape,
      }),
    )
    .min(1, 'the answer has no choices'),
  usage: usageSchema.optional(),
  ...promptTokensShape,
});
export type Completion = z.infer<typeof completionSchema>;

/** A checked completion and the raw JSON it was read from (both redacted). */
export interface ModelAnswer {
  completion: Completion;
  raw: unknown;
}

/** One request to a chat-completions endpoint. */
export interface ModelRequest {
  url: string;
  apiKey?: string;
  /** The request's JSON body. */
  body: unknown;
  /** For the whole answer, headers and body. */
  timeoutMs: number;
  /** Applied to everything read from the endpoint before it is used or shown. */
  redactor: Redactor;
}

/** Up to `maxBytes` of a response's body; `overflowed` when there was more (the rest is not read). */
export async function readUpTo(
  response: Response,
  maxBytes: number,
): Promise<{ bytes: Buffer; overflowed: boolean }> {
  if (Number(response.headers.get('content-length')) > maxBytes) {
    await response.body?.cancel().catch(() => undefined);
    return { bytes: Buffer.alloc(0), overflowed: true };
  }
  const reader: ReadableStreamDefaultReader<Uint8Array> | undefined = response.body?.getReader();
  if (!reader) return { bytes: Buffer.alloc(0), overflowed: false };
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return { bytes: Buffer.concat(chunks), overflowed: false };
    size += value.byteLength;
    if (size > maxBytes) {
      // hang up: the rest is never read, whatever its size
      await reader.cancel().catch(() => undefined);
      return { bytes: Buffer.concat(chunks), overflowed: true };
    }
    chunks.push(value);
  }
}

/** The start of an error's body, redacted, for a message; never throws. */
async function errorExcerpt(response: Response, redactor: Redactor): Promise<string> {
  const { bytes } = await readUpTo(response, MAX_ERROR_BODY_BYTES).catch(() => ({ bytes: Buffer.alloc(0) }));
  // redacted whole before it is cut, so a cut never leaves part of a secret
  const text = redactor.text(bytes.toString('utf8')).trim();
  return text.length > ERROR_EXCERPT_CHARS ? `${text.slice(0, ERROR_EXCERPT_CHARS)}…` : text || '(no body)';
}

/** A thrown value's message with its cause's (fetch says "fetch failed" and puts the reason below). */
export function describe(error: unknown): string {
  const cause = error instanceof Error && error.cause instanceof Error ? `: ${error.cause.message}` : '';
  return `${messageOf(error)}${cause}`;
}

/** The answer of a 2xx response: read within the caps, then checked; any fault is the agent's. */
async function readCompletion(response: Response, request: ModelRequest): Promise<ModelAnswer> {
  const { redactor } = request;
  const { bytes, overflowed } = await readUpTo(response, MAX_ANSWER_BYTES);
  if (overflowed)
    throw new AgentError(`The model's answer is larger than ${MAX_ANSWER_BYTES} bytes: it was not read`);
  let body: unknown;
  try {
    body = JSON.parse(bytes.toString('utf8'));
  } catch (error) {
    throw new AgentError(`The model's answer is not JSON: ${redactor.text(messageOf(error)).slice(0, 200)}`);
  }
  const parsed = completionSchema.safeParse(body);
  if (!parsed.success)
    throw new AgentError(
      `The model's answer is not a usable chat completion: ${redactor.text(issuesText(parsed.error))}`,
    );
  return { completion: redactor.value(parsed.data), raw: redactor.value(body) };
}

/**
 * One chat completion, read by one bounded reader: the whole answer within `timeoutMs` and
 * {@link MAX_ANSWER_BYTES}, then checked (tool calls, and `usage` as whole numbers from 0 to
 * 10^7), then redacted. Whose failure is what:
 * - the agent's ({@link AgentError}, scored 0): an answer too large, too slow (a long generation
 *   is the model's doing), broken off, not JSON or not a completion; a 4xx other than those
 *   below, which a request built from the episode's own conversation causes (a conversation
 *   longer than the model's context is a 400);
 * - infrastructure (retried, then `platform_error`): no connection, 429 and 5xx: the server's
 *   state, which no answer of the model's chooses;
 * - this eval's set-up (`failed_precondition`, reported as infrastructure): 401, 403, 404, 407.
 * Messages quote error bodies only redacted, so an endpoint that echoes the key leaks nothing.
 */
export async function askModel(request: ModelRequest): Promise<ModelAnswer> {
  const { url, redactor } = request;
  const where = redactor.text(url);
  let lastError = '';
  for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
    if (attempt > 1) await sleep(250 * 2 ** attempt);
    const signal = AbortSignal.timeout(request.timeoutMs);
    const slow = () =>
      new AgentError(`The model did not answer within ${request.timeoutMs} ms (requestTimeoutMs)`);
    let response: Response;
    try {
      response = await fetch(url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          ...(request.apiKey ? { authorization: `Bearer ${request.apiKey}` } : {}),
        },
        body: JSON.stringify(request.body),
        signal,
      });
    } catch (error) {
      if (signal.aborted) throw slow();
      lastError = redactor.text(describe(error));
      continue;
    }
    try {
      if (response.ok) return await readCompletion(response, request);
    } catch (error) {
      if (error instanceof AgentError) throw error;
      if (signal.aborted) throw slow();
      throw new AgentError(`The model's answer broke off: ${redactor.text(describe(error))}`);
    }
    const status = response.status;
    const excerpt = await errorExcerpt(response, redactor);
    if (status === 429 || status >= 500) {
      lastError = `HTTP ${status}: ${excerpt}`;
      continue;
    }
    if (CONFIGURATION_STATUSES.has(status))
      throw new SandgymError(
        'failed_precondition',
        `The model endpoint ${where} refused the request (HTTP ${status}): check --base-url, the model's name and SANDGYM_LLM_API_KEY: ${excerpt}`,
      );
    throw new AgentError(
      `The model endpoint refused the conversation (HTTP ${status}; a conversation longer than the model's context is one cause): ${excerpt}`,
    );
  }
  throw new SandgymError(
    'platform_error',
    `The model endpoint ${where} did not answer after ${MAX_ATTEMPTS} tries: ${lastError}`,
    { retryable: true },
  );
}
