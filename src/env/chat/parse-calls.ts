import { z } from 'zod';
import { messageOf } from '../../common/index.ts';

/**
 * Reading tool calls out of a model's answer. The answer is the model's: hostile by nature (huge,
 * malformed, nested without end, thousands of calls), so every reader here is linear in the text,
 * bounded, and says what was wrong instead of throwing.
 */

/** One call as read: its name and arguments, or why it could not be read. */
export type ReadCall =
  | { id?: string; name: string; args: Record<string, unknown> }
  | { id?: string; name?: string; problem: string };

/** What an answer came to: its calls in order, or why none could be read at all. */
export interface ReadAnswer {
  calls: ReadCall[];
  /** The answer as a whole could not be read (too large, too many calls, a parser that failed). */
  problem?: string;
}

/**
 * A parser of the text formats some model emits: the calls the text holds, each a name and its
 * arguments (an object, or its JSON text). Throwing is fine: the model is told why.
 */
export type ToolCallParser = (text: string) => readonly { id?: string; name: unknown; arguments: unknown }[];

/**
 * The text formats read without a parser of the caller's: `hermes` (Hermes, Qwen:
 * `<tool_call>{"name": …, "arguments": {…}}</tool_call>`), `llama3` (Llama 3.x's JSON:
 * `{"name": …, "parameters": {…}}`, several separated by `;`), or `auto`: whichever the text holds.
 */
export type ToolCallFormat = 'auto' | 'hermes' | 'llama3';

/** The longest answer read, in characters; a longer one runs nothing. */
export const MAX_ANSWER_CHARS = 4 * 1024 * 1024;
/** The most calls one answer may make; more, and none runs. */
export const MAX_CALLS_PER_ANSWER = 64;
/** The deepest nesting of a call's JSON. */
const MAX_JSON_DEPTH = 64;
/** The longest call id kept; a longer one is replaced. */
const MAX_CALL_ID_CHARS = 256;

const HERMES_OPEN = '<tool_call>';
const HERMES_CLOSE = '</tool_call>';
const PYTHON_TAG = '<|python_tag|>';
const THINK_CLOSE = '</think>';

/** An answer as chat-completions APIs give it: its text and its structured calls. */
export const assistantMessageSchema = z.object({
  role: z.literal('assistant').optional(),
  content: z.string().nullish(),
  // each call is read on its own: one malformed call is that call's problem, not the answer's
  tool_calls: z.array(z.unknown()).nullish(),
});
export type AssistantMessage = z.infer<typeof assistantMessageSchema>;

const openAiCallSchema = z.object({
  id: z.string().optional(),
  function: z.object({
    name: z.string(),
    arguments: z.union([z.string(), z.record(z.string(), z.unknown())]),
  }),
});

/**
 * The calls an answer makes: a message's `tool_calls` when it has them, else those its text
 * holds, read by `parser` (a format, or the caller's function).
 */
export function readAnswer(
  answer: string | AssistantMessage,
  parser: ToolCallFormat | ToolCallParser,
): ReadAnswer {
  const message = typeof answer === 'string' ? { content: answer } : answer;
  const text = message.content ?? '';
  if (text.length > MAX_ANSWER_CHARS)
    return refuse(`the answer is ${text.length} characters, over the ${MAX_ANSWER_CHARS} read: nothing ran`);
  if (message.tool_calls?.length) {
    if (message.tool_calls.length > MAX_CALLS_PER_ANSWER) return tooMany(message.tool_calls.length);
    return { calls: message.tool_calls.map(readOpenAiCall) };
  }
  // a reasoning model's thoughts may show calls it then decided against
  const end = text.lastIndexOf(THINK_CLOSE);
  const said = end < 0 ? text : text.slice(end + THINK_CLOSE.length);
  if (typeof parser === 'function') return readWith(parser, said);
  const format = parser === 'auto' ? formatOf(said) : parser;
  if (format === 'hermes') return readHermes(said);
  if (format === 'llama3') return readLlama(said);
  return { calls: [] };
}

function refuse(problem: string): ReadAnswer {
  return { calls: [], problem };
}

function tooMany(count: number | string): ReadAnswer {
  return refuse(tooManyText(count));
}

function tooManyText(count: number | string): string {
  return `the answer makes ${count} tool calls, more than the ${MAX_CALLS_PER_ANSWER} one turn may: none ran`;
}

/** Which format `text` is in, if any. */
function formatOf(text: string): ToolCallFormat | undefined {
  if (text.includes(HERMES_OPEN)) return 'hermes';
  const start = text.trimStart();
  if (start.startsWith(PYTHON_TAG) || start.startsWith('{') || start.startsWith('[')) return 'llama3';
  return undefined;
}

function readOpenAiCall(raw: unknown): ReadCall {
  const parsed = openAiCallSchema.safeParse(raw);
  if (!parsed.success)
    return {
      problem: 'the call is not {"id", "function": {"name", "arguments"}} as chat completions have it',
    };
  const { id, function: fn } = parsed.data;
  const args =
    typeof fn.arguments === 'string' ? argumentsOfText(fn.arguments) : checkedArguments(fn.arguments);
  return withId(
    id,
    'problem' in args ? { name: fn.name, problem: args.problem } : { name: fn.name, args: args.args },
  );
}

function withId(id: string | undefined, call: ReadCall): ReadCall {
  return id && id.length <= MAX_CALL_ID_CHARS ? { ...call, id } : call;
}

function readWith(parser: ToolCallParser, text: string): ReadAnswer {
  let found;
  try {
    found = parser(text);
  } catch (error) {
    return refuse(`the tool calls could not be read: ${messageOf(error).slice(0, 1024)}`);
  }
  if (!Array.isArray(found)) return refuse('the tool-call parser returned no list of calls');
  if (found.length > MAX_CALLS_PER_ANSWER) return tooMany(found.length);
  return {
    calls: found.map((call: { id?: unknown; name: unknown; arguments: unknown }) =>
      readNamed(call?.name, call?.arguments, typeof call?.id === 'string' ? call.id : undefined),
    ),
  };
}

/** Hermes' and Qwen's `<tool_call>` blocks; one left open (its stop string cut) runs to the end. */
function readHermes(text: string): ReadAnswer {
  const calls: ReadCall[] = [];
  let at = text.indexOf(HERMES_OPEN);
  while (at >= 0) {
    if (calls.length === MAX_CALLS_PER_ANSWER) return tooMany(`more than ${MAX_CALLS_PER_ANSWER}`);
    const start = at + HERMES_OPEN.length;
    const end = text.indexOf(HERMES_CLOSE, start);
    calls.push(readJsonCall(text.slice(start, end < 0 ? undefined : end)));
    at = end < 0 ? -1 : text.indexOf(HERMES_OPEN, end + HERMES_CLOSE.length);
  }
  return { calls };
}

/** Llama 3's JSON calls: an object, a list of them, or objects separated by `;`. */
function readLlama(text: string): ReadAnswer {
  let body = text.trim();
  if (body.startsWith(PYTHON_TAG)) body = body.slice(PYTHON_TAG.length).trim();
  if (body.startsWith('[')) {
    const parsed = parseJson(body);
    if ('problem' in parsed) return refuse(`the tool calls are not JSON: ${parsed.problem}`);
    if (!Array.isArray(parsed.value)) return refuse('the tool calls are not a JSON list');
    if (parsed.value.length > MAX_CALLS_PER_ANSWER) return tooMany(parsed.value.length);
    return { calls: parsed.value.map((call: unknown) => namedCallOf(call)) };
  }
  const pieces = topLevelObjects(body);
  if ('problem' in pieces) return refuse(pieces.problem);
  return { calls: pieces.objects.map(readJsonCall) };
}

/**
 * The top-level `{…}` spans of `text` (strings respected), with only whitespace, `;` or `,`
 * between them: one linear pass, stopped as soon as the text is no such list.
 */
function topLevelObjects(text: string): { objects: string[] } | { problem: string } {
  const objects: string[] = [];
  let depth = 0;
  let inString = false;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"' && depth > 0) inString = true;
    else if (c === '{' || c === '[') {
      if (depth === 0) {
        if (c === '[') return { problem: 'the tool calls are not JSON objects' };
        if (objects.length === MAX_CALLS_PER_ANSWER)
          return { problem: tooManyText(`more than ${MAX_CALLS_PER_ANSWER}`) };
        start = i;
      }
      if (++depth > MAX_JSON_DEPTH)
        return { problem: `a tool call nests deeper than ${MAX_JSON_DEPTH} levels` };
    } else if (c === '}' || c === ']') {
      if (depth === 0) return { problem: `the tool calls are not JSON: unmatched "${c}"` };
      if (--depth === 0) objects.push(text.slice(start, i + 1));
    } else if (depth === 0 && !/[\s;,]/.test(c ?? '')) {
      return { problem: 'the tool calls are not JSON: text stands between them' };
    }
  }
  // a call cut short (the answer hit its length) is still read, and told why it fails
  if (depth > 0) objects.push(text.slice(start));
  return { objects };
}

/** How deeply `text`'s JSON nests, counted in one pass; stops counting past the limit. */
function tooDeep(text: string): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{' || c === '[') {
      if (++depth > MAX_JSON_DEPTH) return true;
    } else if (c === '}' || c === ']') depth--;
  }
  return false;
}

function parseJson(text: string): { value: unknown } | { problem: string } {
  if (tooDeep(text)) return { problem: `it nests deeper than ${MAX_JSON_DEPTH} levels` };
  try {
    return { value: JSON.parse(text) as unknown };
  } catch (error) {
    return { problem: messageOf(error).slice(0, 512) };
  }
}

/** A call written as JSON text: `{"name": …, "arguments" | "parameters": {…}}`. */
function readJsonCall(text: string): ReadCall {
  const parsed = parseJson(text.trim());
  if ('problem' in parsed) return { problem: `the tool call is not JSON: ${parsed.problem}` };
  return namedCallOf(parsed.value);
}

function namedCallOf(value: unknown): ReadCall {
  if (!value || typeof value !== 'object' || Array.isArray(value))
    return { problem: 'a tool call is a JSON object {"name": …, "arguments": {…}}' };
  const call = value as Record<string, unknown>;
  return readNamed(call['name'], call['arguments'] ?? call['parameters'] ?? {});
}

function readNamed(name: unknown, args: unknown, id?: string): ReadCall {
  if (typeof name !== 'string' || name.length === 0)
    return { problem: 'a tool call names its tool in "name", a string' };
  const read = typeof args === 'string' ? argumentsOfText(args) : checkedArguments(args);
  return withId(id, 'problem' in read ? { name, problem: read.problem } : { name, args: read.args });
}

type ReadArguments = { args: Record<string, unknown> } | { problem: string };

/** Arguments given as JSON text (chat completions' form). */
function argumentsOfText(text: string): ReadArguments {
  if (text.trim() === '') return { args: {} };
  const parsed = parseJson(text);
  if ('problem' in parsed) return { problem: `the arguments are not JSON: ${parsed.problem}` };
  return checkedArguments(parsed.value);
}

function checkedArguments(value: unknown): ReadArguments {
  if (!value || typeof value !== 'object' || Array.isArray(value))
    return {
      problem: `the arguments must be a JSON object, not ${Array.isArray(value) ? 'a list' : value === null ? 'null' : typeof value}`,
    };
  return { args: value as Record<string, unknown> };
}
