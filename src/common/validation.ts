import { z } from 'zod';
import { SandgymError } from './errors.ts';

/**
 * Parses `value` at a trust boundary. On failure the error names where the value came from and
 * every field that is wrong, so the caller knows what to change.
 */
export function parseAt<T extends z.ZodType>(schema: T, value: unknown, where: string): z.infer<T> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const problems = result.error.issues
    .map((issue) => `${issue.path.length ? issue.path.join('.') : '(root)'}: ${issue.message}`)
    .join('; ');
  throw new SandgymError('invalid_argument', `Invalid ${where}: ${problems}`);
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
