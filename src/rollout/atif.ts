import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { writeFileAtomic } from '../common/index.ts';
import type { EpisodeReport, StepEvent } from './episode-report.ts';
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
    .object({ prompt_tokens: z.number().int().optional(), completion_tokens: z.number().int().optional() })
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
      const calls = new Set(step.tool_calls?.map((call) => call.tool_call_id));
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

function agentStep(step: StepEvent, stepId: number, agent: AtifAgent): AtifTrajectory['steps'][number] {
  const callId = `call_${step.stepIndex}`;
  const { type, ...args } = step.action;
  return {
    step_id: stepId,
    ...(step.startedAt ? { timestamp: step.startedAt } : {}),
    source: 'agent',
    ...(agent.modelName ? { model_name: agent.modelName } : {}),
    message: step.agentMessage ?? '',
    tool_calls: [{ tool_call_id: callId, function_name: type, arguments: args }],
    observation: { results: [{ source_call_id: callId, content: observationText(step.observation) }] },
    ...(step.usage
      ? {
          metrics: { prompt_tokens: step.usage.promptTokens, completion_tokens: step.usage.completionTokens },
        }
      : {}),
    extra: {
      reward: step.reward,
      outcome: step.outcome,
      replayed: step.replayed,
      duration_ms: step.durationMs,
      ...(step.platformMs === undefined ? {} : { platform_ms: step.platformMs }),
      ...(step.signals ? { signals: step.signals } : {}),
    },
  };
}

/**
 * One episode as an ATIF trajectory: the task's instruction as the user's step, then one agent
 * step per env step (its action as a tool call, its observation as the call's result, the
 * model's tokens as metrics). The reward, outcome and grade go in `extra`.
 */
export function toAtif(report: EpisodeReport, instruction: string, agent: AtifAgent): AtifTrajectory {
  const steps = report.trajectory ?? [];
  const usage = steps.flatMap((step) => (step.usage ? [step.usage] : []));
  const first = steps[0]?.startedAt;
  return {
    schema_version: ATIF_VERSION,
    session_id: report.episodeId ?? `${report.task}-unstarted`,
    agent: {
      name: agent.name,
      version: agent.version,
      ...(agent.modelName ? { model_name: agent.modelName } : {}),
    },
    steps: [
      { step_id: 1, ...(first ? { timestamp: first } : {}), source: 'user', message: instruction },
      ...steps.map((step, index) => agentStep(step, index + 2, agent)),
    ],
    final_metrics: {
      ...(usage.length
        ? {
            total_prompt_tokens: usage.reduce((sum, u) => sum + u.promptTokens, 0),
            total_completion_tokens: usage.reduce((sum, u) => sum + u.completionTokens, 0),
          }
        : {}),
      total_steps: steps.length + 1,
    },
    extra: {
      task: report.task,
      reward: report.reward,
      outcome: report.outcome,
      tampered: report.tampered,
      ...(report.details ? { details: report.details } : {}),
      ...(report.sandboxId ? { sandbox_id: report.sandboxId } : {}),
      // where the episode's time went, by phase, and what of it was the platform's
      ...(report.timings ? { timings_ms: report.timings } : {}),
      ...(report.overheadMs === undefined ? {} : { overhead_ms: report.overheadMs }),
    },
  };
}

/** Writes each episode's trajectory to `<dir>/<task>.<episode>.json` (crash-safe); returns the paths. */
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
    written.push(path);
  }
  return written;
}
