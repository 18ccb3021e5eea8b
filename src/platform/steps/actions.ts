import { z } from 'zod';
import { textWithoutNul } from '../../common/index.ts';

/**
 * The most text one action may carry (a file's content, a command and its environment), in
 * bytes, counting a little for each string's framing: under the wire's 65 MiB message cap and the
 * in-sandbox agent's 80 MiB frame, past which a request would end the sandbox (`agent_crash`).
 */
const MAX_ACTION_BYTES = 32 * 1024 * 1024;
/** What each string of an action costs beyond its bytes: its framing on the wire and in the agent. */
const STRING_OVERHEAD_BYTES = 8;
/** The longest a command may ask to run: a week. */
export const MAX_COMMAND_TIMEOUT_MS = 7 * 24 * 60 * 60 * 1000;

const absolutePath = textWithoutNul()
  .startsWith('/', 'paths are absolute')
  .refine((path) => !path.split('/').includes('..'), 'paths must not contain a ".." component');

/** A process environment's name: what the kernel would otherwise cut at `=` or NUL. */
const envName = z.string().regex(/^[^=\0]+$/, 'env names are non-empty, without "=" or a NUL byte');

/** The bytes of text in an action, with each string's framing. */
function textBytes(value: unknown): number {
  if (typeof value === 'string') return Buffer.byteLength(value) + STRING_OVERHEAD_BYTES;
  if (Array.isArray(value)) return value.reduce((sum: number, item) => sum + textBytes(item), 0);
  if (value && typeof value === 'object')
    return Object.entries(value).reduce((sum, [key, item]) => sum + textBytes(key) + textBytes(item), 0);
  return 0;
}

/** What an agent may do in a sandbox. Validated at the door: actions come from a policy. */
export const sandboxActionSchema = z
  .discriminatedUnion('type', [
    z.object({
      type: z.literal('exec'),
      /** A program and its arguments, or a shell line run with /bin/sh -c. */
      command: z.union([z.array(textWithoutNul()).min(1), textWithoutNul().min(1)], {
        error:
          'a command is a program and its arguments (a list of strings) or a shell line, not empty and without NUL bytes',
      }),
      cwd: absolutePath.optional(),
      env: z.record(envName, textWithoutNul()).optional(),
      timeoutMs: z.number().int().positive().max(MAX_COMMAND_TIMEOUT_MS).optional(),
      /**
       * A named shell session: the command starts where the session's last command left off (its
       * working directory and exported variables) and passes its own on to the next.
       */
      session: z
        .string()
        .regex(/^[A-Za-z0-9_-]{1,64}$/, 'session names are 1-64 letters, digits, _ and -')
        .optional(),
    }),
    z.object({ type: z.literal('write_file'), path: absolutePath, content: z.string() }),
    z.object({ type: z.literal('read_file'), path: absolutePath }),
    z.object({ type: z.literal('list_dir'), path: absolutePath }),
    z.object({ type: z.literal('submit') }),
  ])
  .superRefine((action, context) => {
    const bytes = textBytes(action);
    if (bytes > MAX_ACTION_BYTES)
      context.addIssue({
        code: 'custom',
        message: `the action carries ${bytes} bytes of text, over the ${MAX_ACTION_BYTES}-byte limit: write a big file in parts`,
      });
  });

export type SandboxAction = z.infer<typeof sandboxActionSchema>;

/**
 * What a step records for something a policy gave that is not an action: why not, and a
 * bounded copy of what was given. It runs nothing; its observation is an `invalid_action` error.
 */
export interface InvalidAction {
  type: 'invalid';
  problem: string;
  given: unknown;
}

/** What a step carries: an action, or the record of one that was not valid. */
export type StepAction = SandboxAction | InvalidAction;

/** What the agent sees after an action: structured, never a bare string. */
export type SandboxObservation =
  | { type: 'reset'; sandboxId: string; environment: string }
  | {
      type: 'exec';
      stdout: string;
      stderr: string;
      exitCode: number | null;
      signal: string | null;
      timedOut: boolean;
      oomKilled: boolean;
      stdoutTruncated: boolean;
      stderrTruncated: boolean;
      durationMs: number;
    }
  | { type: 'file'; path: string; content: string }
  | { type: 'written'; path: string }
  | {
      type: 'dir';
      path: string;
      entries: { name: string; type: string; size: number }[];
      /** Only some of the folder's entries: it holds more than one listing carries. */
      truncated?: true;
    }
  | { type: 'submitted' }
  | { type: 'error'; code: string; message: string };
