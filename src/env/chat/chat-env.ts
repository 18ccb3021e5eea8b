import { SandgymError, issuesText, parseAt } from '../../common/index.ts';
import { chatOptions, type ChatOptions, type SandboxAction, type StepOutcome } from '../../platform/index.ts';
import type {
  EnvCallOptions,
  Environment,
  ResetInfo,
  ResetOptions,
  ResetResult,
  StepInfo,
  StepResult,
} from '../environment.ts';
import { gradingFailure, type Grade, type TaskObservation } from '../task-env.ts';
import { observationText } from './observation-text.ts';
import {
  assistantMessageSchema,
  readAnswer,
  type AssistantMessage,
  type ReadCall,
  type ToolCallFormat,
  type ToolCallParser,
} from './parse-calls.ts';
import { CHAT_TOOLS, actionOfToolCall, type ChatTool } from './tools.ts';

/** A message of the conversation, as chat-completions APIs and chat templates take it. */
export type ChatMessage =
  | { role: 'system' | 'user'; content: string }
  | { role: 'tool'; tool_call_id: string; name: string; content: string };

/**
 * Options for {@link ChatEnv.create}: the wire's (system prompt, instruction, budgets), and what
 * only a caller in this process can give.
 */
export type ChatEnvOptions = Omit<ChatOptions, 'format'> & {
  /** The caller's tokenizer: counts each answer and each tool message the env returns. */
  countTokens?: (text: string) => number;
  /** How text answers hold their calls: a format, or the caller's parser. Default `auto`. */
  parser?: ToolCallFormat | ToolCallParser;
};

/** Options for {@link ChatEnv.step}. */
export interface ChatStepOptions extends EnvCallOptions {
  /** This turn's tokens as the caller counted them (the answer, and what it was shown). */
  tokens?: number;
}

/** What one call of a turn came to. */
export interface ChatCallRecord {
  id: string;
  name: string;
  /** The env step it ran as; absent when it did not run. */
  stepIndex?: number;
  /** Why it did not run. */
  problem?: string;
}

/** Turns taken, and tokens counted, in a chat episode so far. */
export interface ChatProgress {
  turns: number;
  tokens: number;
}

/**
 * What a chat reset says besides the messages: the env's reset info, the tools, and the turns
 * and tokens already spent (0, but for a resumed episode).
 */
export type ChatResetInfo = ResetInfo & ChatProgress & { tools: readonly ChatTool[] };

/** What a turn says besides its messages. `stepIndex` is the turn's index. */
export interface ChatStepInfo extends StepInfo {
  /** The turn's calls, in order. */
  calls: ChatCallRecord[];
  /** Turns taken, and tokens counted, in this episode so far. */
  turns: number;
  tokens: number;
  /** The grade, once the episode ended and was graded (a task env). */
  grade?: Grade;
}

/** The inner env: a task's, or a sandbox's; a task's is graded when a budget cuts its episode. */
type InnerEnv = Environment<SandboxAction, TaskObservation> & { grade?: () => Promise<Grade> };

const DEFAULT_SYSTEM_PROMPT =
  'You are an agent working in a Linux sandbox to complete a task. Act only through the tools, and call submit when the task is done.';
const NO_CALL = `No tool call found: act through the tools (${CHAT_TOOLS.map((t) => t.function.name).join(', ')}), and call submit when the task is done.`;

/**
 * An env at the level of chat messages, for trainers that generate with their own engine: reset
 * gives the opening messages, and each step takes the model's answer (text, or a message with
 * `tool_calls`), runs every call it makes, in order, as steps of the inner env (logged exactly
 * once, like any step), and gives back the tool messages. An answer that cannot be read, or a call
 * that is no valid action, is an observation the model reads: never an exception. Budgets of turns
 * and tokens truncate the episode, graded as it stands.
 *
 * @example
 * ```ts
 * const chat = ChatEnv.create(TaskEnv.create(platform, task), { maxTurns: 20 });
 * const { observation: prompt } = await chat.reset();
 * const turn = await chat.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>');
 * console.log(prompt.length, turn.reward, turn.terminated);
 * ```
 */
export class ChatEnv implements Environment<
  string | AssistantMessage,
  ChatMessage[],
  ChatResetInfo,
  ChatStepInfo
> {
  private episodeId: string | undefined;
  private turns = 0;
  private tokens = 0;
  private hasEnded = false;
  private readonly parser: ToolCallFormat | ToolCallParser;

  private constructor(
    private readonly inner: InnerEnv,
    private readonly options: ChatEnvOptions,
  ) {
    this.parser = options.parser ?? 'auto';
  }

  /** A chat env over `inner`, which it closes with itself. Options are checked here. */
  static create(inner: InnerEnv, options: ChatEnvOptions = {}): ChatEnv {
    const { countTokens, parser, ...plain } = options;
    parseAt(
      chatOptions,
      { ...plain, ...(typeof parser === 'string' ? { format: parser } : {}) },
      'ChatEnv options',
    );
    if (countTokens !== undefined && typeof countTokens !== 'function')
      throw new SandgymError(
        'invalid_argument',
        'ChatEnv options: countTokens must be a function of the text',
      );
    return new ChatEnv(inner, options);
  }

  /** The tools the model is given (also in each reset's info). */
  get tools(): readonly ChatTool[] {
    return CHAT_TOOLS;
  }

  /** Starts an episode of the inner env; its observation is the system and user messages. */
  async reset(options: ResetOptions = {}): Promise<ResetResult<ChatMessage[], ChatResetInfo>> {
    return this.begin(await this.inner.reset(options), { turns: 0, tokens: 0 });
  }

  /** Where the episode is: what {@link ChatEnv.resume} needs to go on from a checkpoint of it. */
  get progress(): ChatProgress {
    return { turns: this.turns, tokens: this.tokens };
  }

  /**
   * Goes on with a chat episode from `restored`, what the inner env's restore of a checkpoint
   * made during one returned, with the turns and tokens spent by then: the budgets count on, and
   * the opening messages are the episode's. Forks of a group's episode start this way.
   */
  resume(
    restored: ResetResult<TaskObservation, ResetInfo>,
    progress: ChatProgress,
  ): ResetResult<ChatMessage[], ChatResetInfo> {
    return this.begin(restored, progress);
  }

  /** Whether the episode ended (terminated, or truncated by the env or a budget). */
  get ended(): boolean {
    return this.hasEnded;
  }

  /**
   * Takes over an episode whose inner env was rebuilt over its sandbox (a node's successor does
   * this after a crash): it goes on at turn `progress.turns`, ended if it had.
   */
  continueEpisode(episodeId: string, progress: ChatProgress, ended: boolean): void {
    this.episodeId = episodeId;
    this.turns = progress.turns;
    this.tokens = progress.tokens;
    this.hasEnded = ended;
  }

  private begin(
    { observation, info }: ResetResult<TaskObservation, ResetInfo>,
    progress: ChatProgress,
  ): ResetResult<ChatMessage[], ChatResetInfo> {
    this.continueEpisode(info.episodeId, progress, false);
    const instruction =
      observation.type === 'task'
        ? observation.instruction
        : (this.options.instruction ??
          `You are in a Linux sandbox${observation.type === 'reset' ? ` (${observation.environment})` : ''}.`);
    return {
      observation: [
        { role: 'system', content: this.options.systemPrompt ?? DEFAULT_SYSTEM_PROMPT },
        { role: 'user', content: instruction },
      ],
      info: { ...info, tools: CHAT_TOOLS, ...progress },
    };
  }

  /** One turn: the model's answer in, every call it makes run in order, the tool messages out. */
  async step(
    answer: string | AssistantMessage,
    options: ChatStepOptions = {},
  ): Promise<StepResult<ChatMessage[], ChatStepInfo>> {
    if (this.episodeId === undefined)
      throw new SandgymError('failed_precondition', 'Call reset() before step()');
    if (this.hasEnded)
      throw new SandgymError('failed_precondition', 'The episode ended: call reset() to start another');
    const turn = this.turns++;
    const message = typeof answer === 'string' ? answer : assistantMessageSchema.safeParse(answer);
    const read =
      typeof message === 'string' || message.success
        ? readAnswer(typeof message === 'string' ? message : message.data, this.parser)
        : { calls: [], problem: `the answer is no assistant message: ${issuesText(message.error)}` };
    // a turn that throws (a retry whose calls diverge from the log) did not happen: its index stays
    const turnResult = await this.runCalls(read.calls, turn, options).catch((error: unknown) => {
      this.turns = turn;
      throw error;
    });
    if (read.problem) turnResult.messages.push({ role: 'user', content: `Nothing ran: ${read.problem}.` });
    else if (read.calls.length === 0) turnResult.messages.push({ role: 'user', content: NO_CALL });
    this.tokens += options.tokens ?? this.counted(answer, turnResult.messages);
    const result: StepResult<ChatMessage[], ChatStepInfo> = {
      observation: turnResult.messages,
      reward: turnResult.reward,
      terminated: turnResult.terminated,
      truncated: turnResult.truncated,
      info: {
        episodeId: this.episodeId,
        stepIndex: turn,
        replayed: false,
        calls: turnResult.calls,
        turns: this.turns,
        tokens: this.tokens,
        ...(turnResult.truncatedBy ? { truncatedBy: turnResult.truncatedBy } : {}),
        ...(turnResult.grade ? { grade: turnResult.grade } : {}),
      },
      outcome: turnResult.outcome,
    };
    if (result.terminated || result.truncated) this.hasEnded = true;
    else if (result.outcome.kind === 'ok') await this.applyBudgets(result);
    return result;
  }

  /** Runs a turn's calls in order; after the episode ends or the platform fails, the rest do not run. */
  private async runCalls(calls: ReadCall[], turn: number, options: EnvCallOptions): Promise<TurnResult> {
    const result: TurnResult = {
      messages: [],
      calls: [],
      reward: 0,
      terminated: false,
      truncated: false,
      outcome: { kind: 'ok' },
    };
    let stopped: string | undefined;
    for (const [index, call] of calls.entries()) {
      const id = call.id ?? `call_${turn}_${index}`;
      const name = call.name ?? 'unknown';
      const refuse = (problem: string, content: string) => {
        result.messages.push({ role: 'tool', tool_call_id: id, name, content });
        result.calls.push({ id, name, problem });
      };
      if (stopped) {
        refuse(stopped, `Not run: ${stopped}.`);
        continue;
      }
      const action = 'problem' in call ? { error: call.problem } : actionOfToolCall(call.name, call.args);
      if ('error' in action) {
        refuse(action.error, `Invalid call: ${action.error}`);
        continue;
      }
      const step = await this.inner.step(action, options.signal ? { signal: options.signal } : {});
      result.reward += step.reward;
      result.messages.push({
        role: 'tool',
        tool_call_id: id,
        name,
        content: observationText(step.observation),
      });
      result.calls.push({ id, name, stepIndex: step.info.stepIndex });
      if (step.outcome.kind !== 'ok') {
        result.outcome = step.outcome;
        stopped = 'the platform failed an earlier call of this turn';
      }
      if (step.terminated || step.truncated) {
        result.terminated = step.terminated;
        result.truncated = step.truncated;
        const grade = (step.info as { grade?: Grade }).grade;
        if (grade) result.grade = grade;
        if (step.info.truncatedBy) result.truncatedBy = step.info.truncatedBy;
        stopped = 'the episode ended with an earlier call of this turn';
      }
    }
    return result;
  }

  /** What the caller's tokenizer counts of a turn: the answer, and the messages it gets back. */
  private counted(answer: string | AssistantMessage, messages: ChatMessage[]): number {
    const count = this.options.countTokens;
    if (!count) return 0;
    // the answer's text and its calls' names and arguments: no serialising of what the model nested
    const said =
      typeof answer === 'string'
        ? [answer]
        : [answer.content ?? '', ...(answer.tool_calls ?? []).map(callText)];
    return [...said, ...messages.map((m) => m.content)].reduce((sum, text) => sum + count(text), 0);
  }

  /** Truncates the episode once a budget is spent, graded as it stands when the env grades. */
  private async applyBudgets(result: StepResult<ChatMessage[], ChatStepInfo>): Promise<void> {
    const { maxTurns, maxTokens } = this.options;
    const cut =
      maxTurns !== undefined && this.turns >= maxTurns
        ? 'turn_limit'
        : maxTokens !== undefined && this.tokens >= maxTokens
          ? 'token_limit'
          : undefined;
    if (!cut) return;
    this.hasEnded = true;
    result.truncated = true;
    result.info.truncatedBy = cut;
    if (!this.inner.grade) return;
    try {
      const grade = await this.inner.grade();
      result.reward += grade.reward;
      result.info.grade = grade;
    } catch (error) {
      result.outcome = gradingFailure(error);
    }
  }

  /** Closes the inner env. Idempotent. */
  close(): Promise<void> {
    return this.inner.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** A chat-completions call's name and arguments as text, whatever shape it came in. */
function callText(call: unknown): string {
  const fn = (call as { function?: { name?: unknown; arguments?: unknown } } | null)?.function;
  return [fn?.name, fn?.arguments].filter((part) => typeof part === 'string').join(' ');
}

interface TurnResult {
  messages: ChatMessage[];
  calls: ChatCallRecord[];
  reward: number;
  terminated: boolean;
  truncated: boolean;
  outcome: StepOutcome;
  truncatedBy?: StepInfo['truncatedBy'];
  grade?: Grade;
}
