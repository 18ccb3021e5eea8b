import { z } from 'zod';
import { recordText, type NetworkRecord } from '../backends/index.ts';

/**
 * What the network refused a task episode at each stage: its environment's build, the agent's
 * stage, and the grader's (the tests). A stage that was refused nothing is left out.
 */
export interface NetworkReport {
  build?: NetworkRecord;
  agent?: NetworkRecord;
  grader?: NetworkRecord;
}

/** The stages that were refused something; undefined when none was. */
export function networkReport(stages: {
  [stage in keyof NetworkReport]: NetworkRecord | undefined;
}): NetworkReport | undefined {
  const report: NetworkReport = {};
  for (const stage of ['build', 'agent', 'grader'] as const) {
    const record = stages[stage];
    if (record && (record.denied.length > 0 || record.unresolved.length > 0)) report[stage] = record;
  }
  return Object.keys(report).length > 0 ? report : undefined;
}

/** A report in words, stage by stage: "agent: denied 10.1.2.3:443/tcp; grader: could not resolve x". */
export function networkReportText(report: NetworkReport): string {
  return (['build', 'agent', 'grader'] as const)
    .flatMap((stage) => {
      const record = report[stage];
      return record ? [`${stage}: ${recordText(record)}`] : [];
    })
    .join('; ');
}

const record = z.object({ denied: z.array(z.string()), unresolved: z.array(z.string()) });
const report = z.object({ build: record.optional(), agent: record.optional(), grader: record.optional() });

/** The network report in a grade's details, when there is one (details are the verifiers' words too). */
export function networkReportOf(details: Record<string, unknown> | undefined): NetworkReport | undefined {
  const parsed = report.safeParse(details?.['network']);
  if (!parsed.success) return undefined;
  const { build, agent, grader } = parsed.data;
  return networkReport({ build, agent, grader });
}
