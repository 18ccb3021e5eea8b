import { z } from 'zod';

/** The most tokens one answer may report: above any model's context, far below absurd. */
const MAX_TOKENS_PER_ANSWER = 10_000_000;
/** The longest tool-call id kept; a longer one is replaced. */
export const MAX_CALL_ID_CHARS = 256;
/**
 * The largest raw answer a turn keeps (its token ids and logprobs are kept apart, whatever the
 * size): above it the record says how large the answer was instead, so a model that answers
 * megabytes each turn cannot grow a report, the journal and the files past memory.
 */
const MAX_KEPT_RESPONSE_CHARS = 4 * 1024 * 1024;

const tokenCount = z.number().int().min(0).max(MAX_TOKENS_PER_ANSWER);
/** A token id: vocabularies are far below 2^31. */
const tokenId = z
  .number()
  .int()
  .min(0)
  .max(2 ** 31 - 1);
const tokenIds = z.array(tokenId).max(MAX_TOKENS_PER_ANSWER);
/** A logprob, as vLLM sends even an impossible token's (-9999.0): finite, never positive. */
const logprob = z.number().max(0).min(-1e6);

/** `usage` of a chat completion, as far as it is read: whole numbers from 0 to 10^7. */
export const usageSchema = z.object({ prompt_tokens: tokenCount, completion_tokens: tokenCount });

/**
 * Per-token data of a choice: `logprobs.content` (OpenAI's shape, which vLLM and SGLang follow:
 * a token reads `token_id:N` when vLLM is asked `return_tokens_as_token_ids`), and vLLM's
 * `token_ids` (asked `return_token_ids`).
 */
export const choiceTokensShape = {
  token_ids: tokenIds.nullable().optional(),
  logprobs: z
    .object({
      content: z
        .array(z.object({ token: z.string(), logprob }))
        .max(MAX_TOKENS_PER_ANSWER)
        .nullable()
        .optional(),
    })
    .nullable()
    .optional(),
};
/** The prompt's token ids, top level (vLLM asked `return_token_ids`). */
export const promptTokensShape = { prompt_token_ids: tokenIds.nullable().optional() };

type ChoiceTokens = z.infer<z.ZodObject<typeof choiceTokensShape>>;

/** A token as `return_tokens_as_token_ids` spells it. */
const TOKEN_ID_TEXT = /^token_id:(\d{1,10})$/;

/** What a turn recorded of its tokens, when the server returned them. */
export interface TurnTokens {
  promptTokenIds?: number[];
  completionTokenIds?: number[];
  logprobs?: number[];
}

/**
 * What a turn records of a checked completion: its usage, and its tokens (see {@link turnTokensOf}).
 */
export function usageAndTokensOf(completion: {
  usage?: z.infer<typeof usageSchema> | undefined;
  prompt_token_ids?: number[] | null | undefined;
  choices: ChoiceTokens[];
}): { usage?: { promptTokens: number; completionTokens: number } } & TurnTokens {
  const { usage } = completion;
  return {
    ...(usage
      ? { usage: { promptTokens: usage.prompt_tokens, completionTokens: usage.completion_tokens } }
      : {}),
    ...turnTokensOf(completion.prompt_token_ids, completion.choices[0]!),
  };
}

/**
 * The token ids and logprobs an answer carries, from whichever shape the server used: the
 * completion's ids from `token_ids`, else from `token_id:N` tokens when every token is one.
 */
function turnTokensOf(promptTokenIds: number[] | null | undefined, choice: ChoiceTokens): TurnTokens {
  const content = choice.logprobs?.content ?? undefined;
  const fromText = content?.map((entry) => TOKEN_ID_TEXT.exec(entry.token)?.[1]);
  const completionTokenIds =
    choice.token_ids ??
    (fromText?.length && fromText.every((id) => id !== undefined) ? fromText.map(Number) : undefined);
  return {
    ...(promptTokenIds ? { promptTokenIds } : {}),
    ...(completionTokenIds ? { completionTokenIds } : {}),
    ...(content ? { logprobs: content.map((entry) => entry.logprob) } : {}),
  };
}

/** What the model spent on one turn, in the report's units. */
const tokenUsageSchema = z.strictObject({ promptTokens: tokenCount, completionTokens: tokenCount });

/**
 * One call of a chat-completions endpoint, as the model agent and `sandgym proxy` record it: the
 * request as sent, the raw answer, its usage, token ids and logprobs. In the model agent's
 * records, a `null` in `request.messages` is the previous turn's message at that index, so an
 * episode's records grow with its conversation, not with its square.
 */
export const modelTurnSchema = z.object({
  startedAt: z.string().max(64),
  durationMs: z.number().min(0),
  request: z.record(z.string(), z.unknown()),
  /** The upstream's HTTP status (`sandgym proxy`'s records). */
  status: z.number().int().optional(),
  /** The answer's JSON, as the server sent it (a stream: its chunks, assembled). */
  response: z.unknown().optional(),
  /** Set instead of `response` when that was larger than a record keeps. */
  responseChars: z.number().int().min(0).optional(),
  usage: tokenUsageSchema.optional(),
  promptTokenIds: tokenIds.optional(),
  completionTokenIds: tokenIds.optional(),
  logprobs: z.array(logprob).max(MAX_TOKENS_PER_ANSWER).optional(),
  /** The answer's tool calls, ids as the model gave them (an unusable id replaced). */
  toolCalls: z
    .array(z.object({ id: z.string().max(MAX_CALL_ID_CHARS), name: z.string(), arguments: z.string() }))
    .optional(),
  /**
   * What the model was told that no env step answered: a call refused (bad arguments, an
   * unknown tool, one past the turn's limit) or a nudge to act through a tool.
   */
  feedback: z.array(z.object({ callId: z.string().optional(), content: z.string() })).optional(),
  /** Why the answer (or the request) failed, for a record of a failure. */
  error: z.string().optional(),
});
export type ModelTurn = z.infer<typeof modelTurnSchema>;

/** The raw answer as a record keeps it: whole, or only its size when it is too large. */
export function keptResponse(raw: unknown): Pick<ModelTurn, 'response' | 'responseChars'> {
  const chars = JSON.stringify(raw)?.length ?? 0;
  return chars > MAX_KEPT_RESPONSE_CHARS ? { responseChars: chars } : { response: raw };
}
