import { EPISODE_PHASES, networkReportOf, networkReportText, type EpisodeTimings } from '../env/index.ts';
import type { EpisodeReport, StepEvent } from './episode-report.ts';

function escape(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** A horizontal bar chart as inline SVG: one labelled bar per entry. */
function barChart(title: string, entries: [string, number][], unit = ''): string {
  const max = Math.max(1, ...entries.map(([, v]) => v));
  const rowHeight = 26;
  const bars = entries
    .map(([label, value], i) => {
      const width = Math.round((value / max) * 300);
      const y = i * rowHeight;
      return (
        `<text x="0" y="${y + 17}" class="label">${escape(label)}</text>` +
        `<rect x="170" y="${y + 4}" width="${width}" height="18" rx="3"></rect>` +
        `<text x="${176 + width}" y="${y + 17}" class="value">${escape(`${Number(value.toFixed(2))}${unit}`)}</text>`
      );
    })
    .join('');
  return `<figure><figcaption>${escape(title)}</figcaption><svg width="560" height="${entries.length * rowHeight + 4}" role="img" aria-label="${escape(title)}">${bars}</svg></figure>`;
}

/** One colour per phase, in phase order: the platform's phases blue-grey, the task's own warm. */
const PHASE_COLOURS: Record<(typeof EPISODE_PHASES)[number], string> = {
  environment: '#8da0c4',
  services: '#7f93b8',
  create: '#4a7bd0',
  probe: '#6f87b0',
  taskStartup: '#e0a14a',
  staging: '#5d79a8',
  network: '#3f6bb8',
  agent: '#d9534f',
  step: '#2f5aa0',
  command: '#f0b86b',
  inspect: '#56709e',
  diff: '#1f4a8c',
  graderCreate: '#3b66ad',
  graderStaging: '#4f6d9f',
  tests: '#e8c170',
  graderTeardown: '#6983b3',
  teardown: '#9fb0cf',
};

/**
 * Where each episode's time went: one stacked bar per episode, a segment per phase (hover
 * names it), and a legend of the phases that occur.
 */
function phaseBars(episodes: readonly EpisodeReport[]): string {
  const timed = episodes.filter((e): e is EpisodeReport & { timings: EpisodeTimings } => !!e.timings);
  if (timed.length === 0) return '';
  const total = (t: EpisodeTimings): number => EPISODE_PHASES.reduce((sum, p) => sum + (t[p] ?? 0), 0);
  const max = Math.max(1, ...timed.map((e) => total(e.timings)));
  const rowHeight = 22;
  const rows = timed
    .map((e, i) => {
      let x = 170;
      const y = i * rowHeight;
      const segments = EPISODE_PHASES.filter((p) => (e.timings[p] ?? 0) > 0)
        .map((phase) => {
          const ms = e.timings[phase] ?? 0;
          const width = (ms / max) * 360;
          const rect = `<rect x="${x.toFixed(1)}" y="${y + 3}" width="${width.toFixed(1)}" height="16" style="fill:${PHASE_COLOURS[phase]}"><title>${phase} ${ms.toFixed(1)} ms</title></rect>`;
          x += width;
          return rect;
        })
        .join('');
      const overhead = e.overheadMs === undefined ? '' : `, platform ${Math.round(e.overheadMs)} ms`;
      return `<text x="0" y="${y + 15}" class="label">${escape(e.task.slice(0, 24))}</text>${segments}<text x="${(x + 6).toFixed(1)}" y="${y + 15}" class="value">${Math.round(total(e.timings))} ms${overhead}</text>`;
    })
    .join('');
  const present = EPISODE_PHASES.filter((p) => timed.some((e) => (e.timings[p] ?? 0) > 0));
  const legend = present
    .map((p) => `<span class="phase"><i style="background:${PHASE_COLOURS[p]}"></i>${p}</span>`)
    .join(' ');
  return `<figure class="phases"><figcaption>Where each episode's time went (ms, by phase)</figcaption><svg width="760" height="${timed.length * rowHeight + 4}" role="img" aria-label="episode phases">${rows}</svg><div class="legend">${legend}</div></figure>`;
}

function percentile(values: number[], q: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))] ?? 0;
}

/**
 * Why an episode got its reward, as one cell: the verifier's reason, each metric of a reward.json,
 * and, folded, the build notes and the end of the verifier's output.
 */
function whyOf(e: EpisodeReport): string {
  const details = e.details ?? {};
  const reason = e.agentFailure
    ? `the agent failed: ${e.agentFailure}`
    : typeof details['reason'] === 'string'
      ? details['reason']
      : 'message' in e.outcome
        ? e.outcome.message
        : (e.error ?? '');
  const metrics = details['metrics'] as Record<string, number> | undefined;
  const network = networkReportOf(details);
  const folded: [string, string][] = [
    ['build notes', (e.buildNotes ?? []).join('\n')],
    ['verifier stdout (end)', typeof details['stdoutTail'] === 'string' ? details['stdoutTail'] : ''],
    ['verifier stderr (end)', typeof details['stderrTail'] === 'string' ? details['stderrTail'] : ''],
  ];
  return (
    escape(reason) +
    (metrics
      ? `<div class="metrics">${Object.entries(metrics)
          .map(([name, value]) => `${escape(name)} = ${value}`)
          .join(', ')}</div>`
      : '') +
    (network ? `<div class="network">network refused ${escape(networkReportText(network))}</div>` : '') +
    folded
      .filter(([, text]) => text.trim())
      .map(
        ([title, text]) => `<details><summary>${escape(title)}</summary><pre>${escape(text)}</pre></details>`,
      )
      .join('')
  );
}

/** The evaluation report: a summary, three charts and the per-task table, in one static HTML file. */
export function renderHtmlReport(title: string, episodes: EpisodeReport[], steps: StepEvent[]): string {
  const scored = episodes.filter((e) => e.outcome.kind === 'ok');
  const resolved = scored.filter((e) => e.reward >= 1).length;
  const bins: [string, number][] = [
    ['0', scored.filter((e) => e.reward <= 0).length],
    ['0 < r < 1', scored.filter((e) => e.reward > 0 && e.reward < 1).length],
    ['1 or more', scored.filter((e) => e.reward >= 1).length],
  ];
  const outcomes = new Map<string, number>();
  for (const e of episodes) outcomes.set(e.outcome.kind, (outcomes.get(e.outcome.kind) ?? 0) + 1);
  const byAction = new Map<string, number[]>();
  for (const s of steps) byAction.set(s.action.type, [...(byAction.get(s.action.type) ?? []), s.durationMs]);
  const latency: [string, number][] = [...byAction.entries()].flatMap(([action, times]) => [
    [`${action} p50`, percentile(times, 0.5)] as [string, number],
    [`${action} p95`, percentile(times, 0.95)] as [string, number],
  ]);
  const rows = episodes
    .map(
      (e) =>
        `<tr><td>${escape(e.task)}</td><td class="num">${e.reward}</td><td>${escape(e.outcome.kind)}${
          'reason' in e.outcome ? ` (${escape(e.outcome.reason)})` : ''
        }</td><td class="num">${e.steps}</td><td class="num">${(e.durationMs / 1000).toFixed(1)} s</td><td>${escape(e.tampered.join(', '))}</td><td>${whyOf(e)}</td></tr>`,
    )
    .join('\n');
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escape(title)}</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 2em; color: #1d2330; }
h1 { font-size: 1.4em; } .summary { margin: 1em 0 2em; font-size: 1.1em; }
.charts { display: flex; flex-wrap: wrap; gap: 2em; } figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: .5em; }
rect { fill: #4a7bd0; } .label, .value { font-size: 12px; fill: #1d2330; }
table { border-collapse: collapse; margin-top: 2em; } th, td { padding: 4px 12px; border-bottom: 1px solid #dde; text-align: left; }
.network { color: #8a3b12; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.phase i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; } .legend { font-size: 12px; max-width: 760px; }
pre { max-width: 60em; max-height: 20em; overflow: auto; background: #f4f5f8; padding: .5em; } .metrics { color: #4a5468; }
</style></head><body>
<h1>${escape(title)}</h1>
<p class="summary">${resolved} of ${episodes.length} tasks resolved; ${episodes.length - scored.length} infrastructure or verifier outcomes (not rewards); ${steps.length} steps.</p>
<div class="charts">
${barChart('Reward distribution (episodes)', bins)}
${barChart('Outcomes (episodes)', [...outcomes.entries()])}
${barChart('Latency per step (ms)', latency, ' ms')}
${phaseBars(episodes)}
</div>
<table><thead><tr><th>task</th><th>reward</th><th>outcome</th><th>steps</th><th>time</th><th>tamper signals</th><th>why</th></tr></thead>
<tbody>
${rows}
</tbody></table>
</body></html>
`;
}
