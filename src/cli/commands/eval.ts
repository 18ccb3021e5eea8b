import { secretRedactor, urlSecrets, writeFileAtomic } from '../../common/index.ts';
import { loadTasks, networkReportOf, networkReportText } from '../../env/index.ts';
import { join } from 'node:path';
import { defaultDataDir, hostPlatformOf } from '../../platform/index.ts';
import { openPlatform } from './cluster.ts';
import {
  EvalJournal,
  RolloutRunner,
  TrainingCoordinator,
  renderHtmlReport,
  resolveAgent,
  modelOfAgent,
  writeAtif,
  type EvalProgress,
  type ModelEndpoint,
  type StepEvent,
} from '../../rollout/index.ts';
import {
  IMAGE_SOURCE_OPTIONS,
  TASK_LOAD_OPTIONS,
  taskLoadOptions,
  durationMs,
  imageSources,
  parseCommandArgs,
  positiveInt,
  text,
} from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';
import { SANDGYM_VERSION } from '../version.ts';

/** The named metrics of a reward.json, when the verifier kept them. */
function metricsOf(details: Record<string, unknown> | undefined): Record<string, number> | undefined {
  const metrics = details?.['metrics'];
  if (!metrics || typeof metrics !== 'object') return undefined;
  const numbers = Object.entries(metrics).filter(
    (entry): entry is [string, number] => typeof entry[1] === 'number',
  );
  return numbers.length ? Object.fromEntries(numbers) : undefined;
}

/** Each metric's mean over the episodes that report it: a multi-metric suite is not one average. */
function meanMetrics(all: (Record<string, number> | undefined)[]): Record<string, number> {
  const sums = new Map<string, { sum: number; n: number }>();
  for (const metrics of all)
    for (const [name, value] of Object.entries(metrics ?? {})) {
      const s = sums.get(name) ?? { sum: 0, n: 0 };
      sums.set(name, { sum: s.sum + value, n: s.n + 1 });
    }
  return Object.fromEntries([...sums].map(([name, { sum, n }]) => [name, sum / n]));
}

function progressLine(p: EvalProgress): string {
  const eta = p.etaMs === undefined ? '' : `, ETA ${Math.ceil(p.etaMs / 1000)}s`;
  return `sandgym eval: ${p.done}/${p.total} done, ${p.running} running, ${p.failed} failed${eta}`;
}

/** How an `openai:MODEL` agent asks its model. */
const MODEL_OPTIONS = {
  temperature: { type: 'string' },
  'max-tokens': { type: 'string' },
  'system-prompt': { type: 'string' },
  'token-ids': { type: 'boolean' },
} as const;

/** The model settings the command line gives; only an `openai:MODEL` agent takes them. */
function modelSettings(parsed: ReturnType<typeof parseCommandArgs>, agentName: string): ModelEndpoint {
  const given = Object.keys(MODEL_OPTIONS).filter((name) => parsed.values[name] !== undefined);
  if (given.length && modelOfAgent(agentName) === undefined)
    throw new UsageError(`sandgym eval: --${given[0]} is for --agent openai:MODEL, not ${agentName}`);
  const temperature = text(parsed, 'temperature');
  if (temperature !== undefined && !(Number(temperature) >= 0 && Number(temperature) <= 2))
    throw new UsageError(`--temperature must be a number from 0 to 2, got "${temperature}"`);
  const maxTokens = positiveInt('max-tokens', text(parsed, 'max-tokens'));
  const systemPrompt = text(parsed, 'system-prompt');
  return {
    ...(temperature === undefined ? {} : { temperature: Number(temperature) }),
    ...(maxTokens === undefined ? {} : { maxTokens }),
    ...(systemPrompt === undefined ? {} : { systemPrompt }),
    ...(parsed.values['token-ids'] ? { tokenIds: true } : {}),
  };
}

/** How long an eval's run lease lasts unless `--lease` says otherwise. */
const DEFAULT_RUN_LEASE_MS = 30_000;

/**
 * `sandgym eval TASK... [--agent oracle|nop|MODULE] [--concurrency N] [--run NAME [--lease 30s]]
 * [--json OUT] [--report OUT.html]`.
 */
export async function evalCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('eval', args, {
    agent: { type: 'string', default: 'oracle' },
    concurrency: { type: 'string' },
    json: { type: 'string' },
    report: { type: 'string' },
    'max-steps': { type: 'string' },
    'base-url': { type: 'string' },
    ...MODEL_OPTIONS,
    atif: { type: 'string' },
    run: { type: 'string' },
    lease: { type: 'string' },
    'decision-timeout': { type: 'string' },
    ...IMAGE_SOURCE_OPTIONS,
    ...TASK_LOAD_OPTIONS,
  });
  if (parsed.positionals.length === 0)
    throw new UsageError('sandgym eval: give task folders, e.g. sandgym eval examples/tasks');
  const agentName = text(parsed, 'agent') ?? 'oracle';
  const baseUrl = text(parsed, 'base-url');
  // a key from the environment, never the command line (which `ps` shows to every user)
  const apiKey = process.env['SANDGYM_LLM_API_KEY'] ?? process.env['OPENAI_API_KEY'];
  const { makeAgent, identity } = await resolveAgent(agentName, {
    ...(baseUrl ? { baseUrl } : {}),
    ...(apiKey ? { apiKey } : {}),
    ...modelSettings(parsed, agentName),
  });
  // the key goes nowhere this eval writes or prints, in any encoding
  const redactor = secretRedactor([apiKey, ...urlSecrets(baseUrl)]);
  const say = (line: string): boolean => process.stderr.write(redactor.text(line));
  const tasks = await loadTasks(parsed.positionals, taskLoadOptions(parsed));
  const concurrency = positiveInt('concurrency', text(parsed, 'concurrency')) ?? 2;
  const maxSteps = positiveInt('max-steps', text(parsed, 'max-steps'));
  const journal = await EvalJournal.open(
    await EvalJournal.pathFor(join(defaultDataDir(), 'evals'), {
      tasks,
      agent: identity,
      ...(maxSteps ? { maxSteps } : {}),
    }),
    { redactor },
  );
  const resumed = tasks.filter((t) => journal.get(t.id)).length;
  if (resumed > 0)
    console.error(
      `sandgym eval: resuming: ${resumed} of ${tasks.length} tasks finished in an earlier run (${journal.path})`,
    );
  // durable: if this eval is killed, its running sandboxes live on for the next one to take over
  // (on a cluster, they live on their nodes anyway)
  await using platform = await openPlatform({ durable: true, images: imageSources(parsed) });
  const adopted = (await hostPlatformOf(platform)?.adoptSandboxes()) ?? [];
  const takenOver = tasks.filter((t) => journal.startedEpisode(t.id)).length;
  if (adopted.length > 0 || takenOver > 0) {
    console.error(
      `sandgym eval: ${adopted.length} sandboxes of an interrupted run are still alive; ${takenOver} running episodes fast-forward from their logs`,
    );
  }
  const runName = text(parsed, 'run');
  const leaseMs = durationMs('lease', text(parsed, 'lease'));
  if (leaseMs !== undefined && !runName) throw new UsageError('sandgym eval: --lease goes with --run NAME');
  // joins the run (starting it if it is new) and renews its lease while this eval lives: if the
  // eval dies, the run's sandboxes hibernate and a rerun with the same --run resumes them
  const coordinator = runName
    ? await TrainingCoordinator.start(platform, { name: runName, leaseMs: leaseMs ?? DEFAULT_RUN_LEASE_MS })
    : undefined;
  if (coordinator) {
    const status = await coordinator.run.renew();
    console.error(
      `sandgym eval: in run ${status.name} (phase ${status.phase}, ${status.sandboxes} sandboxes), renewing its lease while this eval runs`,
    );
  }
  const interactive = process.stderr.isTTY;
  const decisionTimeoutMs = durationMs('decision-timeout', text(parsed, 'decision-timeout'));
  const runner = new RolloutRunner(platform, makeAgent, {
    ...(decisionTimeoutMs === undefined ? {} : { decisionTimeoutMs }),
    concurrency,
    journal,
    redactor,
    ...(runName ? { run: runName } : {}),
    ...(maxSteps ? { maxSteps } : {}),
    onProgress: (p) => (interactive ? process.stderr.write(`\r${progressLine(p)}  `) : undefined),
  });
  const steps: StepEvent[] = [];
  runner.steps$.subscribe((step) => steps.push(redactor.value(step)));
  runner.episodes$.subscribe((r) => {
    const outcome =
      r.outcome.kind === 'ok'
        ? ''
        : ` [${r.outcome.kind}${'reason' in r.outcome ? `: ${r.outcome.reason}` : ''}] ${r.outcome.message}`;
    const tamper = r.tampered.length ? ` tampered: ${r.tampered.join(', ')}` : '';
    const egress = r.deniedEgress ? ` denied egress: ${r.deniedEgress}` : '';
    const refused = networkReportOf(r.details);
    const network = refused ? ` network refused ${networkReportText(refused)}` : '';
    const metrics = metricsOf(r.details);
    const perMetric = metrics
      ? ` (${Object.entries(metrics)
          .map(([name, value]) => `${name} ${value}`)
          .join(', ')})`
      : '';
    const reason = r.agentFailure ? `the agent failed: ${r.agentFailure}` : r.details?.['reason'];
    const why = r.reward < 1 && typeof reason === 'string' ? `: ${reason}` : '';
    say(
      `${interactive ? '\r' : ''}${r.task}: reward ${r.reward}${perMetric}${outcome}${tamper}${egress}${network} (${r.steps} steps, ${(r.durationMs / 1000).toFixed(1)}s)${why}\n`,
    );
    // how its environment was had: a FROM mapped, pulled or built on a fallback base
    for (const note of r.buildNotes ?? []) say(`  ${r.task}: ${note}\n`);
  });
  // the run is the trainer's to end: an eval only stops renewing it
  const reports = redactor.value(await runner.run(tasks).finally(() => coordinator?.stopRenewing()));
  // the run completed: nothing is left to resume
  await journal.remove();
  const summary = {
    agent: agentName,
    tasks: reports.length,
    resolved: reports.filter((r) => r.outcome.kind === 'ok' && r.reward >= 1).length,
    failedInfrastructure: reports.filter((r) => r.outcome.kind !== 'ok' && r.outcome.kind !== 'task_error')
      .length,
    taskErrors: reports.filter((r) => r.outcome.kind === 'task_error').length,
    meanReward: reports.reduce((sum, r) => sum + r.reward, 0) / Math.max(1, reports.length),
    meanMetrics: meanMetrics(reports.map((r) => metricsOf(r.details))),
    episodes: reports,
  };
  const out = text(parsed, 'json');
  if (out) await writeFileAtomic(out, JSON.stringify(summary, null, 2));
  const report = text(parsed, 'report');
  if (report) {
    await writeFileAtomic(
      report,
      renderHtmlReport(`sandgym eval: ${tasks.length} tasks, agent ${agentName}`, reports, steps),
    );
    console.error(`sandgym eval: report written to ${report}`);
  }
  const atif = text(parsed, 'atif');
  if (atif) {
    const model = modelOfAgent(agentName);
    const instructions = new Map(tasks.map((task) => [task.id, task.instruction]));
    const written = await writeAtif(atif, reports, (task) => instructions.get(task) ?? '', {
      name: agentName,
      version: SANDGYM_VERSION,
      ...(model ? { modelName: model } : {}),
    });
    console.error(`sandgym eval: ${written.length} ATIF trajectories written to ${atif}`);
  }
  console.error(`sandgym eval: ${summary.resolved}/${summary.tasks} resolved with --agent ${agentName}`);
  if (summary.failedInfrastructure > 0) return EXIT.infrastructure;
  // a task that cannot run as written is bad input: its author must fix it
  if (summary.taskErrors > 0) {
    console.error(
      `sandgym eval: ${summary.taskErrors} task(s) cannot run as written; see their messages above`,
    );
    return EXIT.usage;
  }
  return summary.resolved === summary.tasks ? EXIT.ok : EXIT.failed;
}
