/** What stands in for a secret that was found. */
const REDACTED = '[redacted]';

/** A secret's encodings shorter than this are left alone: they match too much ordinary text. */
const MIN_ENCODED_CHARS = 8;

/**
 * The shortest run of a secret's characters that is redacted on its own: a secret cut in pieces
 * (half in one string, half in another, joined later by whoever reads both) loses every piece
 * this long, so at most a few characters of it survive between two cuts.
 */
const MIN_PIECE_CHARS = 8;

/** Removes secrets from text, and from every string of a plain value. */
export interface Redactor {
  text(text: string): string;
  value<T>(value: T): T;
}

/**
 * The runs of base64 that `secret` comes to wherever it sits in a longer encoded text: base64
 * packs 3 bytes into 4 characters, so the secret starting at each of the 3 byte offsets gives
 * another run. Only characters made of the secret's bits alone are kept.
 */
function base64Runs(secret: string): string[] {
  const bytes = Buffer.from(secret);
  return [0, 1, 2].flatMap((shift) => {
    const encoded = Buffer.concat([Buffer.alloc(shift), bytes]).toString('base64');
    const run = encoded.slice(Math.ceil((8 * shift) / 6), Math.floor((8 * (shift + bytes.length)) / 6));
    return [run, run.replaceAll('+', '-').replaceAll('/', '_')];
  });
}

/** Hex digits of `code`, either case. */
function hexPattern(code: number, digits: number): string {
  return code
    .toString(16)
    .padStart(digits, '0')
    .replace(/[a-f]/g, (h) => `[${h}${h.toUpperCase()}]`);
}

/**
 * Every way one character of a secret travels in text: as is, JSON- or JS-escaped (`\/`, `\"`,
 * `\u0073`, with the backslash itself escaped any number of times) or URL-encoded (`%2F`). Each
 * character is matched on its own, so a secret with its escapes mixed is still found.
 */
function charPattern(char: string): string {
  const code = char.charCodeAt(0);
  const literal = char.replace(/[.*+?^${}()|[\]\\/-]/g, '\\$&');
  const forms = [literal, `\\\\+u${hexPattern(code, 4)}`];
  if (code < 0x80) forms.push(`%${hexPattern(code, 2)}`, `\\\\+x${hexPattern(code, 2)}`);
  if ('/"\\\''.includes(char)) forms.push(`\\\\+${literal}`);
  return `(?:${forms.join('|')})`;
}

/**
 * What finds a secret's pieces: `windows` matches any {@link MIN_PIECE_CHARS} characters of it in
 * a row (each in any of its forms); `at[offset]` matches its character at `offset` there and then,
 * to grow a window found into the whole run of the secret around it.
 */
interface Pieces {
  windows: RegExp;
  at: RegExp[];
  size: number;
}

function piecesOf(secret: string): Pieces {
  const chars = [...secret].map(charPattern);
  const size = Math.min(MIN_PIECE_CHARS, chars.length);
  const windows: string[] = [];
  for (let start = 0; start + size <= chars.length; start++)
    windows.push(chars.slice(start, start + size).join(''));
  return {
    windows: new RegExp(windows.join('|'), 'g'),
    at: chars.map((char) => new RegExp(char, 'y')),
    size,
  };
}

/** Where the pieces of one secret sit in `text`, as [start, end) ranges in order, each grown whole. */
function cutsOf(text: string, { windows, at, size }: Pieces): [number, number][] {
  const cuts: [number, number][] = [];
  /** The end of the secret's characters from `offset` on, matched in a row from `position`. */
  const grow = (position: number, offset: number): number => {
    for (; offset < at.length; offset++) {
      const char = at[offset]!;
      char.lastIndex = position;
      if (!char.test(text)) break;
      position = char.lastIndex;
    }
    return position;
  };
  windows.lastIndex = 0;
  for (let match = windows.exec(text); match; match = windows.exec(text)) {
    // which window it was: the first offset whose run from here reaches as far
    let end = match.index + match[0].length;
    for (let offset = 0; offset + size <= at.length; offset++) {
      const reached = grow(match.index, offset);
      if (reached - match.index >= match[0].length) end = Math.max(end, reached);
    }
    windows.lastIndex = end;
    const last = cuts.at(-1);
    if (last && match.index <= last[1]) last[1] = Math.max(last[1], end);
    else cuts.push([match.index, end]);
  }
  return cuts;
}

function isPlainObject(value: object): boolean {
  const prototype = Object.getPrototypeOf(value) as unknown;
  return prototype === Object.prototype || prototype === null;
}

/**
 * A redactor for `secrets` (an API key, a token): every occurrence of one, whole or in pieces
 * of at least {@link MIN_PIECE_CHARS} characters, as is, JSON-, unicode- or URL-escaped (mixed
 * too), or base64'd, becomes `[redacted]`. Apply it to whatever text came from outside with the
 * secret in reach (an endpoint's error body, a model's answer, what a sandbox printed) before it
 * is kept or shown, and once more to what is written, after it is serialised.
 */
export function secretRedactor(secrets: readonly (string | undefined)[]): Redactor {
  const given = [...new Set(secrets.filter((s): s is string => !!s))];
  const encoded = [...new Set(given.flatMap(base64Runs))]
    .filter((form) => form.length >= MIN_ENCODED_CHARS)
    .sort((a, b) => b.length - a.length);
  const pieces = given.map(piecesOf);
  const text = (input: string): string => {
    let out = encoded.reduce((o, form) => (o.includes(form) ? o.split(form).join(REDACTED) : o), input);
    for (const secret of pieces) {
      const cuts = cutsOf(out, secret);
      for (const [start, end] of cuts.reverse()) out = `${out.slice(0, start)}${REDACTED}${out.slice(end)}`;
    }
    return out;
  };
  const value = (input: unknown): unknown => {
    if (typeof input === 'string') return text(input);
    if (Array.isArray(input)) return input.map(value);
    if (input && typeof input === 'object' && isPlainObject(input))
      return Object.fromEntries(Object.entries(input).map(([key, item]) => [text(key), value(item)]));
    return input;
  };
  return {
    text: (input) => (given.length ? text(input) : input),
    value: <T>(input: T): T => (given.length ? (value(input) as T) : input),
  };
}

/**
 * The secrets a URL carries in its user info (`https://user:key@host/`), which fetch quotes back
 * in its errors: to redact beside an API key.
 */
export function urlSecrets(url: string | undefined): string[] {
  if (!url) return [];
  try {
    const { username, password } = new URL(url);
    return [password, username].filter(Boolean).flatMap((part) => [part, decodeURIComponent(part)]);
  } catch {
    return [];
  }
}
