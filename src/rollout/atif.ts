import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { writeFileAtomic } from '../common/index.ts';
import type { EpisodeReport, StepEvent } from './episode-report.ts';
import type { ModelTurn } from './model-turn.ts';
import { observationText } from './observation-text.ts';

/** The ATIF version these trajectories follow (Harbor's Agent Trajectory Interchange Format). */
const ATIF_VERSION = 'ATIF-v1.4';

const toolCall = z.object({
  tool_call_id: z.string(),
  function_name: z.string(),
  arguments: z.record(z.string(), z.unknown()),
});
const atifStep = z.object({
  step_id: z.number().int().positive(),
  timestamp: z.string().optional(),
  source: z.enum(['system', 'user', 'agent']),
  model_name: z.string().optional(),
  message: z.string(),
  tool_calls: z.array(toolCall).optional(),
  observation: z
    .object({
      results: z.array(z.object({ source_call_id: z.string().optional(), content: z.string().optional() })),
    })
    .optional(),
  metrics: z
    .object({
      prompt_tokens: z.number().int().optional(),
      completion_tokens: z.number().int().optional(),
      prompt_token_ids: z.array(z.number().int()).optional(),
      completion_token_ids: z.array(z.number().int()).optional(),
      logprobs: z.array(z.number()).optional(),
    })
    .strict()
    .optional(),
  extra: z.record(z.string(), z.unknown()).optional(),
});

/**
 * An ATIF trajectory, as far as sandgym writes one; {@link atifTrajectorySchema} checks the rules
 * ATIF sets beyond field types (step ids 1, 2, 3...; every result answers a tool call of its step).
 */
export const atifTrajectorySchema = z
  .object({
    schema_version: z.literal(ATIF_VERSION),
    session_id: z.string().min(1),
    agent: z.object({ name: z.string(), version: z.string(), model_name: z.string().optional() }),
    steps: z.array(atifStep),
    notes: z.string().optional(),
    final_metrics: z
      .object({
        total_prompt_tokens: z.number().int().optional(),
        total_completion_tokens: z.number().int().optional(),
        total_steps: z.number().int().optional(),
      })
      .optional(),
    extra: z.record(z.string(), z.unknown()).optional(),
  })
  .superRefine((trajectory, context) => {
    trajectory.steps.forEach((step, index) => {
      if (step.step_id !== index + 1)
        context.addIssue({
          code: 'custom',
          message: `step ${index} has step_id ${step.step_id}, not ${index + 1}`,
        });
      if (step.source !== 'agent' && (step.tool_calls || step.metrics))
        context.addIssue({
          code: 'custom',
          message: `step ${step.step_id} is a ${step.source} step: only agent steps have tool_calls and metrics`,
        });
      const calls = new Set(step.tool_calls?.map((call) => call.tool_call_id));
      if (calls.size !== (step.tool_calls?.length ?? 0))
        context.addIssue({ code: 'custom', message: `step ${step.step_id} has two tool calls of one id` });
      for (const result of step.observation?.results ?? [])
        if (result.source_call_id !== undefined && !calls.has(result.source_call_id))
          context.addIssue({
            code: 'custom',
            message: `step ${step.step_id} answers an unknown call ${result.source_call_id}`,
          });
    });
  });
export type AtifTrajectory = z.infer<typeof atifTrajectorySchema>;

/** Who ran the episode: the agent's name (as `--agent` gave it), sandgym's version, the model. */
export interface AtifAgent {
  name: string;
  version: string;
  modelName?: string;
}

type AtifStep = AtifTrajectory['steps'][number];

/** What an env step adds to the ATIF step that shows it: reward, outcome, timings, signals. */
function envExtra(step: StepEvent): Record<string, unknown> {
  return {
    reward: step.reward,
    outcome: step.outcome,
    replayed: step.replayed,
    duration_ms: step.durationMs,
    ...(step.platformMs === undefined ? {} : { platform_ms: step.platformMs }),
    ...(step.signals ? { signals: step.signals } : {}),
  };
}

function metricsOf(
  usage: { promptTokens: number; completionTokens: number } | undefined,
  turn?: ModelTurn,
): Pick<AtifStep, 'metrics'> {
  const metrics = {
    ...(usage ? { prompt_tokens: usage.promptTokens, completion_tokens: usage.completionTokens } : {}),
    ...(turn?.promptTokenIds ? { prompt_token_ids: turn.promptTokenIds } : {}),
    ...(turn?.completionTokenIds ? { completion_token_ids: turn.completionTokenIds } : {}),
    ...(turn?.logprobs ? { logprobs: turn.logprobs } : {}),
  };
  return Object.keys(metrics).length ? { metrics } : {};
}

/** A step of an agent that records no model turns: its action as a call of sandgym's naming. */
function plainAgentStep(step: StepEvent, agent: AtifAgent): Omit<AtifStep, 'step_id'> {
  const callId = `call_${step.stepIndex}`;
  const { type, ...args } = step.action;
  return {
    ...(step.startedAt ? { timestamp: step.startedAt } : {}),
    source: 'agent',
    ...(agent.modelName ? { model_name: agent.modelName } : {}),
    message: step.agentMessage ?? '',
    tool_calls: [{ tool_call_id: callId, function_name: type, arguments: args }],
    observation: { results: [{ source_call_id: callId, content: observationText(step.observation) }] },
    ...metricsOf(step.usage),
    extra: envExtra(step),
  };
}

/** A call's arguments as ATIF wants them, an object: what the model sent when it is one. */
function argumentsOf(text: string): Record<string, unknown> {
  try {
    const parsed: unknown = JSON.parse(text || '{}');
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed))
      return parsed as Record<string, unknown>;
  } catch {
    // shown raw below
  }
  return { unparsed_arguments: text };
}

/** One model answer: its calls by the model's ids, what it was told for those no step ran. */
function turnStep(turn: ModelTurn, agent: AtifAgent): Omit<AtifStep, 'step_id'> {
  const content = turn.response as { choices?: { message?: { content?: unknown } }[] } | undefined;
  const said = content?.choices?.[0]?.message?.content;
  return {
    timestamp: turn.startedAt,
    source: 'agent',
    ...(agent.modelName ? { model_name: agent.modelName } : {}),
    message: typeof said === 'string' ? said : '',
    ...(turn.toolCalls
      ? {
          tool_calls: turn.toolCalls.map((call) => ({
            tool_call_id: call.id,
            function_name: call.name,
            arguments: argumentsOf(call.arguments),
          })),
        }
      : {}),
    observation: {
      results: (turn.feedback ?? []).map((said) => ({
        ...(said.callId === undefined ? {} : { source_call_id: said.callId }),
        content: said.content,
      })),
    },
    ...metricsOf(turn.usage, turn),
    extra: { ...(turn.error ? { error: turn.error } : {}), env_steps: [] },
  };
}

/**
 * The agent steps of an episode. A model agent's steps carry their turns (see StepEvent): one
 * ATIF step per answer, unusable ones too, with the model's own call ids; each env step's
 * observation becomes the result of the call it ran, in the step of the answer that made it. A
 * step the agent took without the model (a submit after unusable answers) is a system step,
 * never a call the model did not make.
 */
function episodeSteps(steps: readonly StepEvent[], agent: AtifAgent): Omit<AtifStep, 'step_id'>[] {
  const out: Omit<AtifStep, 'step_id'>[] = [];
  let answer: Omit<AtifStep, 'step_id'> | undefined;
  for (const step of steps) {
    if (!step.turns) {
      out.push(plainAgentStep(step, agent));
      continue;
    }
    for (const turn of step.turns) out.push((answer = turnStep(turn, agent)));
    const result = { content: observationText(step.observation) };
    if (step.callId !== undefined && answer?.tool_calls?.some((call) => call.tool_call_id === step.callId)) {
      answer.observation!.results.push({ source_call_id: step.callId, ...result });
      (answer.extra!['env_steps'] as unknown[]).push({ call_id: step.callId, ...envExtra(step) });
    } else
      out.push({
        ...(step.startedAt ? { timestamp: step.startedAt } : {}),
        source: 'system',
        message: `The agent took this step itself: ${step.agentMessage ?? step.action.type}`,
        observation: { results: [result] },
        extra: { action: step.action, ...envExtra(step) },
      });
  }
  return out;
}

/** The system prompt the model was given, from the first turn's request. */
function systemPromptOf(steps: readonly StepEvent[]): string | undefined {
  const first = steps.find((step) => step.turns?.length)?.turns?.[0];
  const messages = first?.request['messages'];
  const [opening] = Array.isArray(messages) ? (messages as { role?: unknown; content?: unknown }[]) : [];
  return opening?.role === 'system' && typeof opening.content === 'string' ? opening.content : undefined;
}

/**
 * One episode as an ATIF trajectory: the system prompt (a model agent's) and the task's
 * instruction, then the agent's steps (see episodeSteps), each model answer's tokens, token ids
 * and logprobs as its metrics. The reward, outcome and grade go in `extra`.
 */
export function toAtif(report: EpisodeReport, instruction: string, agent: AtifAgent): AtifTrajectory {
  const steps = report.trajectory ?? [];
  const usage = steps.flatMap((step) => (step.usage ? [step.usage] : []));
  const first = steps[0]?.startedAt;
  const system = systemPromptOf(steps);
  const opening: Omit<AtifStep, 'step_id'>[] = [
    ...(system === undefined ? [] : [{ source: 'system' as const, message: system }]),
    { ...(first ? { timestamp: first } : {}), source: 'user', message: instruction },
  ];
  const all = [...opening, ...episodeSteps(steps, agent)].map((step, index) => ({
    step_id: index + 1,
    ...step,
  }));
  return {
    schema_version: ATIF_VERSION,
    session_id: report.episodeId ?? `${report.task}-unstarted`,
    agent: {
      name: agent.name,
      version: agent.version,
      ...(agent.modelName ? { model_name: agent.modelName } : {}),
    },
    steps: all,
    final_metrics: {
      ...(usage.length
        ? {
            total_prompt_tokens: usage.reduce((sum, u) => sum + u.promptTokens, 0),
            total_completion_tokens: usage.reduce((sum, u) => sum + u.completionTokens, 0),
          }
        : {}),
      total_steps: all.length,
    },
    extra: {
      task: report.task,
      reward: report.reward,
      outcome: report.outcome,
      tampered: report.tampered,
      ...(report.agentFailure ? { agent_failure: report.agentFailure } : {}),
      ...(report.details ? { details: report.details } : {}),
      ...(report.sandboxId ? { sandbox_id: report.sandboxId } : {}),
      // where the episode's time went, by phase, and what of it was the platform's
      ...(report.timings ? { timings_ms: report.timings } : {}),
      ...(report.overheadMs === undefined ? {} : { overhead_ms: report.overheadMs }),
    },
  };
}

/**
 * Writes each episode's trajectory to `<dir>/<task>.<episode>.json` (crash-safe), and a model
 * agent's per-turn records (see ModelTurn) beside it as `<task>.<episode>.turns.jsonl`, one turn
 * a line; returns the trajectories' paths.
 */
export async function writeAtif(
  dir: string,
  reports: readonly EpisodeReport[],
  instructionOf: (task: string) => string,
  agent: AtifAgent,
): Promise<string[]> {
  await mkdir(dir, { recursive: true });
  const written: string[] = [];
  for (const report of reports) {
    const trajectory = toAtif(report, instructionOf(report.task), agent);
    const name = `${report.task}.${trajectory.session_id}`.replace(/[^A-Za-z0-9._-]/g, '_');
    const path = join(dir, `${name}.json`);
    await writeFileAtomic(path, `${JSON.stringify(trajectory, null, 2)}\n`);
    const turns = (report.trajectory ?? []).flatMap((step) => step.turns ?? []);
    if (turns.length)
      await writeFileAtomic(
        join(dir, `${name}.turns.jsonl`),
        turns.map((turn) => `${JSON.stringify(turn)}\n`).join(''),
      );
    written.push(path);
  }
  return written;
}
