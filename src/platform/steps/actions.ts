import { z } from 'zod';
import { textWithoutNul } from '../../common/index.ts';

const absolutePath = textWithoutNul().startsWith('/', 'paths are absolute');

/** What an agent may do in a sandbox. Validated at the door: actions come from a policy. */
export const sandboxActionSchema = z.discriminatedUnion('type', [
  z.object({
    type: z.literal('exec'),
    /** A program and its arguments, or a shell line run with /bin/sh -c. */
    command: z.union([z.array(textWithoutNul()).min(1), textWithoutNul().min(1)]),
    cwd: absolutePath.optional(),
    env: z.record(textWithoutNul(), textWithoutNul()).optional(),
    timeoutMs: z.number().int().positive().optional(),
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
]);

export type SandboxAction = z.infer<typeof sandboxActionSchema>;

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
  | { type: 'dir'; path: string; entries: { name: string; type: string; size: number }[] }
  | { type: 'submitted' }
  | { type: 'error'; code: string; message: string };
