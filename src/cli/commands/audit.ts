import type { TrajectoryRecord } from '../../platform/index.ts';
import { openPlatform } from './cluster.ts';
import { jsonOutput } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/** The audit fields of a logged step (see StepSignals), read leniently: old logs lack them. */
interface LoggedSignals {
  deniedEgress?: number;
  protectedChanges?: string[];
  limitsHit?: string[];
  leftoverProcesses?: number;
  error?: string;
}

interface AuditedStep {
  episodeId: string;
  stepIndex: number;
  startedAt: string;
  durationMs: number;
  action: string;
  exitCode: number | null | undefined;
  signals: LoggedSignals | undefined;
}

function describeAction(action: unknown): string {
  const a = (action ?? {}) as { type?: string; command?: unknown; path?: string };
  if (a.type === 'exec') return Array.isArray(a.command) ? a.command.join(' ') : String(a.command);
  return `${a.type ?? '?'}${a.path ? ` ${a.path}` : ''}`;
}

function auditedStep(record: TrajectoryRecord): AuditedStep {
  const result = (record.result ?? {}) as {
    observation?: { exitCode?: number | null };
    info?: { signals?: LoggedSignals };
  };
  return {
    episodeId: record.episodeId,
    stepIndex: record.stepIndex,
    startedAt: record.startedAt,
    durationMs: record.durationMs,
    action: describeAction(record.action),
    exitCode: result.observation?.exitCode,
    signals: result.info?.signals,
  };
}

/** The signals of all steps together. */
function totals(steps: AuditedStep[]): Required<Omit<LoggedSignals, 'error'>> {
  const all = steps.map((s) => s.signals ?? {});
  return {
    deniedEgress: all.reduce((sum, s) => sum + (s.deniedEgress ?? 0), 0),
    protectedChanges: [...new Set(all.flatMap((s) => s.protectedChanges ?? []))],
    limitsHit: [...new Set(all.flatMap((s) => s.limitsHit ?? []))],
    leftoverProcesses: Math.max(0, ...all.map((s) => s.leftoverProcesses ?? 0)),
  };
}

function signalText(signals: LoggedSignals | undefined): string {
  if (!signals) return '';
  if (signals.error) return `  [${signals.error}]`;
  const parts = [
    signals.deniedEgress ? `denied egress ${signals.deniedEgress}` : '',
    signals.protectedChanges?.length ? `protected ${signals.protectedChanges.join(',')}` : '',
    signals.limitsHit?.length ? `limits ${signals.limitsHit.join(',')}` : '',
    signals.leftoverProcesses ? `left running ${signals.leftoverProcesses}` : '',
  ].filter(Boolean);
  return parts.length ? `  [${parts.join('; ')}]` : '';
}

export const AUDIT_COMMAND = {
  name: 'audit',
  summary: "a sandbox's signals (denied egress, protected paths changed, limits hit) and command history",
  operands: 'ID',
  details: 'An id that names no sandbox, live or logged, is bad input: exit 2, as for kill.',
  options: { ...JSON_OPTION },
} as const satisfies CommandSpec;

/** `sandgym audit ID [--json [OUT]]`: a sandbox's signals and its command history, from its trajectory log. */
export async function auditCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(AUDIT_COMMAND, args);
  const [id, ...extra] = parsed.positionals;
  if (!id || extra.length) throw new UsageError('sandgym audit: give one sandbox id (see sandgym ps)');
  const json = await jsonOutput(parsed);
  await using platform = await openPlatform();
  const record = (await platform.listSandboxes()).find((r) => r.id === id);
  const steps = (await (await platform.stepLog(id)).records()).map(auditedStep);
  // an unknown id is the caller's mistake, as everywhere an id is looked up (kill, env show)
  if (!record && steps.length === 0)
    throw new UsageError(
      `sandgym audit: no sandbox "${id}" and no trajectory of it on this platform (see sandgym ps)`,
    );
  const summary = totals(steps);
  if (json) {
    await json.write({ id, sandbox: record ?? null, signals: summary, steps });
    return EXIT.ok;
  }
  console.log(
    `sandbox ${id}: ${record ? `${record.state}, ${record.labels['environment'] ?? 'no environment'}, created ${record.createdAt}` : 'gone (its trajectory log remains)'}`,
  );
  console.log(
    `signals: denied egress ${summary.deniedEgress}; protected paths changed: ${summary.protectedChanges.join(', ') || 'none'}; limits hit: ${summary.limitsHit.join(', ') || 'none'}; most processes left after a step: ${summary.leftoverProcesses}`,
  );
  console.log(`steps: ${steps.length}`);
  for (const step of steps) {
    const exit = step.exitCode === undefined ? '' : `  exit ${step.exitCode}`;
    console.log(
      `  ${step.episodeId.slice(0, 8)} #${step.stepIndex}  ${step.startedAt}  ${Math.round(step.durationMs)} ms${exit}  ${step.action.slice(0, 120)}${signalText(step.signals)}`,
    );
  }
  return EXIT.ok;
}
