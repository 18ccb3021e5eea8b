import { z } from 'zod';
import { SandgymError } from './errors.ts';

/**
 * Parses `value` at a trust boundary. On failure the error names where the value came from and
 * every field that is wrong, so the caller knows what to change.
 */
export function parseAt<T extends z.ZodType>(schema: T, value: unknown, where: string): z.infer<T> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  throw new SandgymError('invalid_argument', `Invalid ${where}: ${issuesText(result.error)}`);
}

/** Issues named in a message, at most; the rest are counted. */
const MAX_ISSUES_NAMED = 10;
/** The longest a field path or an issue's message may be in a message. */
const MAX_ISSUE_CHARS = 300;

/** A field's name as a message shows it: quoted when it is not a plain word (a NUL, a newline, a dot). */
function pathPart(part: PropertyKey): string {
  return typeof part === 'string' && !/^[\w$-]+$/.test(part) ? JSON.stringify(part) : String(part);
}

function clipped(text: string): string {
  return text.length > MAX_ISSUE_CHARS ? `${text.slice(0, MAX_ISSUE_CHARS)}…` : text;
}

/**
 * What is wrong with a value, field by field (`cwd: paths are absolute; env.A: ...`). Bounded
 * whatever the value: hostile input can have a million bad fields or a megabyte-long key.
 */
export function issuesText(error: z.ZodError): string {
  const named = error.issues.slice(0, MAX_ISSUES_NAMED).map((issue) => {
    // a record's bad key says why in an issue of its own
    const why = issue.code === 'invalid_key' ? (issue.issues[0]?.message ?? issue.message) : issue.message;
    return `${clipped(issue.path.length ? issue.path.map(pathPart).join('.') : '(root)')}: ${clipped(why)}`;
  });
  const more = error.issues.length - named.length;
  return `${named.join('; ')}${more > 0 ? `; and ${more} more` : ''}`;
}

/**
 * A string that can reach a process unchanged: the kernel cuts arguments, environment entries and
 * paths at a NUL byte, so one inside is refused at the door rather than silently shortened.
 */
export function textWithoutNul(): z.ZodString {
  return z.string().regex(/^[^\0]*$/, 'must not contain a NUL byte');
}

/** Whether a path has a `..` component, the one way a path relative to a root can climb out of it. */
export function climbsOut(path: string): boolean {
  return path.split('/').includes('..');
}

/**
 * A path inside a sandbox's tree, as requests name them: relative to its root (`usr/local/bin`) or
 * absolute (`/app`), never with a `..` component. Code joins these to host folders (a diff's copy,
 * an upper dir): refused here, such a path can never climb out to the host's.
 */
export function pathInTree(form: 'relative' | 'absolute'): z.ZodString {
  const path = textWithoutNul()
    .min(1)
    .max(4096)
    .refine((value) => !climbsOut(value), 'must not contain a ".." component');
  return form === 'absolute'
    ? path.refine((value) => value.startsWith('/'), 'paths are absolute')
    : path.refine((value) => !value.startsWith('/'), 'paths are relative to the root, without a leading /');
}

/** An environment variable's name as shells and Docker take it: letters, digits and _, not first a digit. */
export const ENV_VAR_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
