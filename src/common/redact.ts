/** What stands in for a secret that was found. */
const REDACTED = '[redacted]';

/** A secret's encodings shorter than this are left alone: they match too much ordinary text. */
const MIN_ENCODED_CHARS = 8;

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

/** The forms a secret travels in: as is, URL-encoded, JSON-escaped and base64'd. */
function formsOf(secret: string): string[] {
  const encoded = [
    encodeURIComponent(secret),
    encodeURI(secret),
    JSON.stringify(secret).slice(1, -1),
    ...base64Runs(secret),
  ].filter((form) => form.length >= MIN_ENCODED_CHARS);
  return [secret, ...encoded];
}

function isPlainObject(value: object): boolean {
  const prototype = Object.getPrototypeOf(value) as unknown;
  return prototype === Object.prototype || prototype === null;
}

/**
 * A redactor for `secrets` (an API key, a token): every occurrence of one, or of one of its
 * common encodings, becomes `[redacted]`. Apply it to whatever text came from outside with the
 * secret in reach (an endpoint's error body, a model's answer) before it is kept or shown.
 */
export function secretRedactor(secrets: readonly (string | undefined)[]): Redactor {
  const forms = [...new Set(secrets.filter((s): s is string => !!s).flatMap(formsOf))].sort(
    (a, b) => b.length - a.length,
  );
  const text = (input: string): string =>
    forms.reduce((out, form) => (out.includes(form) ? out.split(form).join(REDACTED) : out), input);
  const value = (input: unknown): unknown => {
    if (typeof input === 'string') return text(input);
    if (Array.isArray(input)) return input.map(value);
    if (input && typeof input === 'object' && isPlainObject(input))
      return Object.fromEntries(Object.entries(input).map(([key, item]) => [text(key), value(item)]));
    return input;
  };
  return { text, value: <T>(input: T): T => (forms.length ? (value(input) as T) : input) };
}
