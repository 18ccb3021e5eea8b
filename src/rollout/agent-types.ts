import { z } from 'zod';
import {
  SandgymError,
  issuesText,
  messageOf,
  type Redactor,
  type SandgymErrorOptions,
} from '../common/index.ts';
import type { SandboxAction, Task, TaskObservation } from '../env/index.ts';
import type { TokenUsage } from './episode-report.ts';
import { MAX_CALL_ID_CHARS, modelTurnSchema, type ModelTurn } from './model-turn.ts';

/** What a policy sees besides the observation. */
export interface AgentContext {
  task: Task;
  /** The episode this decision is for: an agent with memory keeps it per episode. */
  episodeId: string;
  stepIndex: number;
}

/** An action with what choosing it cost and said (an LLM agent's tokens and message). */
export interface AgentDecision {
  action: SandboxAction;
  usage?: TokenUsage;
  message?: string;
  /**
   * The model turns this decision took, in order, unusable answers included (a model agent's;
   * empty when it runs the next call of an earlier answer).
   */
  turns?: ModelTurn[];
  /**
   * The model's tool call this action runs, by the model's own id. A decision with `turns` and
   * no `callId` is the agent's own, not a call the model made (it gave up after unusable answers).
   */
  callId?: string;
}

/** A policy: given what it sees, the next action (or a decision that carries one). */
export type Agent = ((
  observation: TaskObservation,
  context: AgentContext,
) => Promise<SandboxAction | AgentDecision>) & {
  /**
   * Set on the oracle: each episode's runner has the platform stage the task's solution for it
   * after the reset (`TaskEnv.stageSolution`), as Harbor does for its oracle; no other agent
   * ever sees one.
   */
  readonly isOracle?: boolean;
  /**
   * The agent's secrets (a model agent's API key): the rollout removes them from every step and
   * report, whatever put them there (a model that pieced its key together in the sandbox).
   */
  readonly redactor?: Redactor;
};

/**
 * The policy failed to decide: its model's answer could not be used (too large, too slow, not a
 * chat completion, absurd token counts), or its decision is not sane. The episode ends there,
 * scored 0 with this message as its `agentFailure`: never masked as the platform's failure,
 * which a policy could otherwise learn to hide behind. An agent module may throw it too.
 */
export class AgentError extends SandgymError {
  constructor(message: string, options: SandgymErrorOptions = {}) {
    super('invalid_argument', message, options);
  }
}

/** The most tokens one decision may report (a few answers of a model, each far below it). */
const MAX_TOKENS_PER_DECISION = 100_000_000;
/** The longest message a decision keeps; the rest is cut. */
const MAX_MESSAGE_CHARS = 64 * 1024;

/** The most model turns one decision may report (the model agent takes at most 4). */
const MAX_TURNS_PER_DECISION = 64;

const tokens = z.number().int().min(0).max(MAX_TOKENS_PER_DECISION);
const decisionSchema = z.object({
  action: z.unknown(),
  usage: z.strictObject({ promptTokens: tokens, completionTokens: tokens }).optional(),
  message: z
    .string()
    .transform((text) => (text.length > MAX_MESSAGE_CHARS ? `${text.slice(0, MAX_MESSAGE_CHARS)}…` : text))
    .optional(),
  turns: z.array(modelTurnSchema).max(MAX_TURNS_PER_DECISION).optional(),
  callId: z.string().max(MAX_CALL_ID_CHARS).optional(),
});

/**
 * The decision an agent's answer comes to. An answer that is no decision (no `action` field) is
 * taken as the action itself, which the env observes as invalid if it is not one; a decision
 * whose usage or message is not sane is the agent's failure ({@link AgentError}).
 */
export function decisionOf(answer: unknown): AgentDecision {
  let parsed;
  try {
    if (!answer || typeof answer !== 'object' || !Object.hasOwn(answer, 'action'))
      return { action: answer as SandboxAction };
    parsed = decisionSchema.safeParse(answer);
  } catch (error) {
    // a revoked proxy, a getter that throws: read once, here, never again downstream
    throw new AgentError(`The agent's decision cannot be read: ${messageOf(error)}`, { cause: error });
  }
  if (!parsed.success) throw new AgentError(`The agent's decision is not sane: ${issuesText(parsed.error)}`);
  const { action, usage, message, turns, callId } = parsed.data;
  return {
    action: action as SandboxAction,
    ...(usage ? { usage } : {}),
    ...(message === undefined ? {} : { message }),
    ...(turns ? { turns } : {}),
    ...(callId === undefined ? {} : { callId }),
  };
}
