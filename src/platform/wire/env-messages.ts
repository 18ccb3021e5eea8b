import { z } from 'zod';
import { ids, notAnId, textWithoutNul } from '../../common/index.ts';
import { sandboxRequestSchema } from '../sandbox-request.ts';

/**
 * Messages of the Envs service: gym environments that live on the node, so a client in any
 * language drives one with Reset, Step, Checkpoint, Restore and Close. docs/wire.md describes
 * them; its golden messages are checked against these schemas.
 */

const count = z.number().int().nonnegative();
const absolutePath = notAnId(textWithoutNul().min(1).max(4096).startsWith('/', 'paths are absolute'));
const envIdField = ids.env();

/** What to make: an env over a fresh sandbox per episode, or a task's env graded on the node. */
export const envSpec = z.discriminatedUnion('kind', [
  z.strictObject({
    kind: z.literal('sandbox'),
    sandbox: sandboxRequestSchema.optional(),
    user: notAnId(textWithoutNul().max(64)).optional(),
    protectedPaths: z.array(absolutePath).max(256).optional(),
  }),
  z.strictObject({
    kind: z.literal('task'),
    /** A task file or folder, resolved beneath the node's task root (`sandgym node --task-root`). */
    path: notAnId(textWithoutNul().min(1).max(4096)),
    /** Which task, when the path holds several (a JSONL file, a folder of tasks). */
    task: notAnId(textWithoutNul().min(1).max(256)).optional(),
  }),
]);
export type EnvSpec = z.output<typeof envSpec>;

export const makeEnvRequest = z.strictObject({
  spec: envSpec,
  /**
   * An env of the caller's to be made beside, on its node: where that env's checkpoints are, so
   * this one can restore them (a group's forks). A controller places it there or waits for room.
   */
  beside: envIdField.optional(),
});
export const envHandle = z.object({ envId: z.string(), kind: z.enum(['sandbox', 'task']) });
export const envRef = z.strictObject({ envId: envIdField });
export const envResetRequest = z.strictObject({
  envId: envIdField,
  seed: z.number().int().optional(),
  /** `episodeId` names the episode (default: a random one). */
  options: z.strictObject({ episodeId: ids.episode('env').optional() }).optional(),
});
const observation = z.record(z.string(), z.unknown());
const info = z.record(z.string(), z.unknown());
export const envResetReply = z.object({ observation, info });
export const envStepRequest = z.strictObject({
  envId: envIdField,
  /** The step's index in its episode: a retried index answers with that step's result again. */
  stepIndex: count,
  /** Parsed by the node's action schema and run in the env's sandbox: it names nothing outside. */
  action: notAnId(z.unknown()),
});
export const envStepReply = z.object({
  observation,
  reward: z.number(),
  terminated: z.boolean(),
  truncated: z.boolean(),
  info,
  outcome: z.record(z.string(), z.unknown()),
});
/** A checkpoint stays on the node; the client holds its id, so what it records cannot be forged. */
export const envCheckpointReply = z.object({
  checkpointId: z.string(),
  /** The environment its state was saved as. */
  environment: z.string(),
  episodeId: z.string(),
  stepIndex: count,
  /** `disk`: files only; `memory`: processes and memory too. */
  depth: z.enum(['disk', 'memory']),
});
export const envRestoreRequest = z.strictObject({
  envId: envIdField,
  checkpointId: ids.envCheckpoint(),
});
/**
 * Which depth to save at: `disk` (files; restores into any env of the project, so forks) or
 * `memory` (processes and memory too; restores in place). Default: the deepest the sandbox has.
 */
export const envCheckpointRequest = envRef.extend({ depth: z.enum(['disk', 'memory']).optional() });

/**
 * How a chat env talks to a model (see ChatEnv): what it is told first, its budgets, and the
 * text format its tool calls come in when its answers are text.
 */
export const chatOptions = z.strictObject({
  /** The system message; default: a short one on acting through the tools. */
  systemPrompt: notAnId(z.string().max(256 * 1024)).optional(),
  /** The first user message of an env with no instruction of its own (a sandbox env). */
  instruction: notAnId(z.string().max(1024 * 1024)).optional(),
  /** Turns (answers stepped) before the episode is truncated. */
  maxTurns: z.number().int().positive().max(1_000_000).optional(),
  /** Tokens (as the caller counts them per step) before the episode is truncated. */
  maxTokens: z.number().int().positive().max(1_000_000_000).optional(),
  /** `auto`: whichever of `hermes` (`<tool_call>` JSON) or `llama3` (bare JSON) a text answer holds. */
  format: z.enum(['auto', 'hermes', 'llama3']).optional(),
});
export type ChatOptions = z.output<typeof chatOptions>;

/** A chat episode: as `Reset`, and how the chat env talks to the model. */
export const chatResetRequest = envResetRequest.extend({ chat: chatOptions.optional() });
const chatMessages = z.array(z.record(z.string(), z.unknown()));
export const chatResetReply = z.object({ messages: chatMessages, info });
/**
 * A chat episode again from a checkpoint made in one, in this env (another, for a fork): its
 * opening messages, its options and budgets spent so far; `episodeId` names the branch.
 */
export const chatRestoreRequest = envRestoreRequest.extend({
  options: z.strictObject({ episodeId: ids.episode('env').optional() }).optional(),
});
export const chatStepRequest = z.strictObject({
  envId: envIdField,
  /** The turn's index in its episode: a retried index answers with that turn's result again. */
  turn: count,
  /**
   * The model's answer, as it gave it: its text, or a chat-completions message (`content`,
   * `tool_calls`). Whatever it holds is read by the chat env, which tells the model what it
   * could not read.
   */
  answer: notAnId(z.union([z.string(), z.record(z.string(), z.unknown())])),
  /** This turn's tokens, as the caller counted them, for the token budget. */
  tokens: count.optional(),
});
export const chatStepReply = envStepReply.omit({ observation: true }).extend({ messages: chatMessages });
