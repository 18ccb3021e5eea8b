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
  checkWritableFile,
  taskLoadOptions,
  durationMs,
  flag,
  imageSources,
  jsonOutput,
  numberOf,
  text,
  type ParsedCommandArgs,
} from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
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
  temperature: { type: 'number', range: [0, 2], description: 'openai:MODEL: its sampling temperature' },
  'max-tokens': {
    type: 'integer',
    range: [1, 1_048_576],
    description: 'openai:MODEL: the most tokens of one answer',
  },
  'system-prompt': { type: 'string', value: 'TEXT', description: 'openai:MODEL: the system prompt' },
  'token-ids': {
    type: 'boolean',
    description: 'openai:MODEL: ask for token ids and logprobs (vLLM)',
  },
} as const;

/** The model settings the command line gives; only an `openai:MODEL` agent takes them. */
function modelSettings(parsed: ParsedCommandArgs, agentName: string): ModelEndpoint {
  const given = Object.keys(MODEL_OPTIONS).filter((name) => parsed.values[name] !== undefined);
  if (given.length && modelOfAgent(agentName) === undefined)
    throw new UsageError(`sandgym eval: --${given[0]} is for --agent openai:MODEL, not ${agentName}`);
  const temperature = numberOf(parsed, 'temperature');
  const maxTokens = numberOf(parsed, 'max-tokens');
  const systemPrompt = text(parsed, 'system-prompt');
  return {
    ...(temperature === undefined ? {} : { temperature }),
    ...(maxTokens === undefined ? {} : { maxTokens }),
    ...(systemPrompt === undefined ? {} : { systemPrompt }),
    ...(flag(parsed, 'token-ids') ? { tokenIds: true } : {}),
  };
}

/** How long an eval's run lease lasts unless `--lease` says otherwise. */
const DEFAULT_RUN_LEASE_MS = 30_000;

export const EVAL_COMMAND = {
  name: 'eval',
  summary: 'run Harbor, Terminal-Bench or SWE-bench tasks, each graded in a fresh sandbox',
  operands: 'TASK...',
  details:
    'Exits 0 when every task is resolved (reward 1), 1 when one is not, 2 for a task that cannot\n' +
    'run as written, 3 when an episode failed on infrastructure. openai:MODEL drives an\n' +
    'OpenAI-compatible endpoint at --base-url (key in $SANDGYM_LLM_API_KEY or $OPENAI_API_KEY).\n' +
    'With --run, killed sandboxes hibernate and a rerun with the same --run resumes them.',
  options: {
    agent: {
      type: 'string',
      value: 'AGENT',
      default: 'oracle',
      description: 'oracle, nop, openai:MODEL or MODULE.js',
    },
    'base-url': { type: 'string', value: 'URL', description: "openai:MODEL: the endpoint's API root" },
    ...MODEL_OPTIONS,
    concurrency: {
      type: 'integer',
      range: [1, 1024],
      default: 2,
      description: 'episodes at once',
    },
    'max-steps': { type: 'integer', range: [1, 100_000], description: 'the most actions of one episode' },
    ...JSON_OPTION,
    report: { type: 'string', value: 'OUT.html', description: 'an HTML report of every episode' },
    atif: { type: 'string', value: 'DIR', description: 'one ATIF trajectory per episode, in DIR' },
    run: { type: 'string', value: 'NAME', description: 'put the sandboxes in training run NAME' },
    lease: {
      type: 'string',
      value: 'DURATION',
      description: "the run's lease, renewed while it runs (default 30s)",
    },
    'decision-timeout': {
      type: 'string',
      value: 'DURATION',
      description: 'how long the agent may think about one step, e.g. 30m',
    },
    ...IMAGE_SOURCE_OPTIONS,
    ...TASK_LOAD_OPTIONS,
  },
} as const satisfies CommandSpec;

/**
 * `sandgym eval TASK... [--agent oracle|nop|MODULE] [--concurrency N] [--run NAME [--lease 30s]]
 * [--json [OUT]] [--report OUT.html]`.
 */
export async function evalCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(EVAL_COMMAND, args);
  if (parsed.positionals.length === 0)
    throw new UsageError('sandgym eval: give task folders, e.g. sandgym eval examples/tasks');
  // what it writes at the end is checked now: an eval's hours are not lost to a typo in a path
  const json = await jsonOutput(parsed);
  const report = text(parsed, 'report');
  if (report) await checkWritableFile('report', report);
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
  const concurrency = numberOf(parsed, 'concurrency') ?? 2;
  const maxSteps = numberOf(parsed, 'max-steps');
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
  await json?.write(summary);
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
