/**
 * sandgym's graders held against the published harnesses on the same recorded outputs: the
 * pytest summaries Terminal-Bench parses, the SWE-bench logs swebench's parsers read, the reward
 * files Harbor's verifier reads, and the task files Harbor's and Terminal-Bench's task models load.
 * The harnesses (pinned in python/requirements-test.txt) run in .venv, all cases in one process
 * (test/support/harness_golden.py). A case where sandgym differs on purpose is listed in DIFFERS
 * with the reason, and must still differ: a harness that changes its mind shows up here too.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePytestSummary, summaryResolves, type PytestOutcome } from '../../src/env/pytest-summary.ts';
import { parseDjangoLog, parseSympyLog } from '../../src/env/repo-test-logs.ts';
import { loadHarborTask } from '../../src/env/tasks/harbor.ts';
import { loadTerminalBenchTask } from '../../src/env/tasks/terminal-bench.ts';
import type { Task } from '../../src/env/tasks/task.ts';
import { parseReward, rewardFileToRead } from '../../src/env/verifiers/reward-file.ts';
import {
  statusOf,
  statusesOfOutcomes,
  sweBenchReport,
  type SweBenchStatus,
} from '../../src/env/verifiers/swebench-grading.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const CORPUS = join(ROOT, 'test/fixtures/harness-outputs');
const PYTHON = join(ROOT, '.venv/bin/python');

/**
 * Where sandgym differs from the harness on purpose, by case id, and why. Each of these cases
 * asserts that the two still differ.
 */
const DIFFERS: Record<string, string> = {
  'pytest/color-rA':
    "Terminal-Bench reads a tmux capture, which has no colour codes; fed pytest's raw colours its " +
    'parser finds no test and resolves the empty summary (all([])). sandgym reads the raw output and ' +
    'drops the colours first, reading it as the capture would',
  'swebench/xarray-skipped-p2p':
    "pytest -rA sums skips up by location, so swebench's log parser never sees the skipped " +
    "PASS_TO_PASS test's id and fails it; sandgym's reporter knows the test was skipped, which " +
    'swebench counts as maintained',
  'reward/bool-value-json': 'Harbor takes true as 1 (a bool is an int in Python); sandgym takes only numbers',
  'reward/empty-object-json': 'Harbor takes {} as no rewards at all; sandgym wants a number to score',
  'reward/underscore-txt':
    "Harbor reads 1_0 as 10 (Python's float() allows digit separators); sandgym refuses it, as " +
    'a reward file is a number, not Python',
  'harbor-task/timeout-zero': 'Harbor takes a timeout of 0 or less; sandgym wants a positive one',
  'harbor-task/timeout-negative': 'Harbor takes a timeout of 0 or less; sandgym wants a positive one',
  'harbor-task/allow-internet-string':
    'Harbor (pydantic, lax) reads "no" as false; sandgym wants a TOML boolean',
  'harbor-task/env-bad-name':
    'Harbor takes any string as an env name; sandgym takes only names a shell can set',
  'harbor-task/allowlist':
    'Harbor takes a wildcard allowed host (*.pythonhosted.org); sandgym resolves each allowed host to ' +
    'addresses when the sandbox starts, which a wildcard has none of, and refuses it',
  'harbor-task/gpus': 'Harbor takes gpus = 1; sandgym refuses it: its sandboxes have no GPUs',
  'harbor-task/allowed-hosts-localhost':
    'Harbor takes localhost as an allowed host; sandgym refuses it: a task author must never ' +
    'open a path from the sandbox to the node',
  'harbor-task/os-windows': 'Harbor takes os = "windows"; sandgym refuses it: its sandboxes run Linux only',
  'tb-task/legacy-descriptions':
    'older Terminal-Bench tasks give their instruction as descriptions[key=base]; sandgym still loads ' +
    "them, Terminal-Bench 0.2's model no longer does",
  'tb-task/test/fixtures/tasks/terminal-bench/legacy-descriptions':
    'older Terminal-Bench tasks give their instruction as descriptions[key=base]; sandgym still loads ' +
    "them, Terminal-Bench 0.2's model no longer does",
  'tb-task/other-parser':
    "sandgym grades with Terminal-Bench's pytest parser only, and refuses a task that names another",
  'tb-task/same-shell-string':
    'Terminal-Bench (pydantic, lax) reads "yes" as true; sandgym wants a YAML boolean',
  'tb-task/timeout-negative': 'Terminal-Bench takes a timeout of 0 or less; sandgym wants a positive one',
};

interface HarnessAnswer {
  python: string;
  results: Record<string, Record<string, unknown>>;
}

interface GoldenCase {
  id: string;
  kind: 'pytest' | 'swebench' | 'reward' | 'harbor-task' | 'tb-task';
  /** What the harness script is sent. */
  input: Record<string, unknown>;
  /** sandgym's verdict, in the harness's shape. */
  sandgym: () => Promise<unknown>;
  /** The harness's verdict, in the shape sandgym's is given. */
  harness: (answer: Record<string, unknown>) => unknown;
}

const listed = (dir: string, suffix = ''): string[] =>
  readdirSync(dir)
    .filter((name) => name.endsWith(suffix))
    .sort();

// -- Terminal-Bench: pytest's short test summary ---------------------------------------------

function pytestCases(): GoldenCase[] {
  const dir = join(CORPUS, 'pytest');
  return listed(dir, '.txt').map((file) => {
    const output = readFileSync(join(dir, file), 'utf8');
    return {
      id: `pytest/${basename(file, '.txt')}`,
      kind: 'pytest',
      input: { output },
      sandgym: () => {
        const results = parsePytestSummary(output);
        if (!results) return Promise.resolve({ summary: false, resolved: false });
        // keyed as the harness keys its dict: by its name for the test
        const tests = Object.fromEntries(results.map((r) => [r.test, r.passed ? 'passed' : 'failed']));
        return Promise.resolve({ summary: true, tests, resolved: summaryResolves(results) });
      },
      harness: (answer) => answer,
    };
  });
}

// -- SWE-bench: each repository family's log parser, and the tests report -------------------

interface SweBenchCaseFile {
  repo: string;
  FAIL_TO_PASS: string[];
  PASS_TO_PASS: string[];
  /**
   * For repositories sandgym grades through pytest's reporter rather than a log: what the
   * reporter says of each node id in the run the log records.
   */
  reported?: Record<string, PytestOutcome>;
}

/** The repositories whose logs sandgym parses itself, with their runner's own output. */
const LOG_PARSERS: Record<string, (log: string) => Map<string, SweBenchStatus>> = {
  'django/django': parseDjangoLog,
  'sympy/sympy': parseSympyLog,
};

function sweBenchCases(): GoldenCase[] {
  const dir = join(CORPUS, 'swebench');
  return listed(dir, '.json').map((file) => {
    const name = basename(file, '.json');
    const row = JSON.parse(readFileSync(join(dir, file), 'utf8')) as SweBenchCaseFile;
    const log = readFileSync(join(dir, `${name}.log`), 'utf8');
    return {
      id: `swebench/${name}`,
      kind: 'swebench',
      input: { repo: row.repo, log, FAIL_TO_PASS: row.FAIL_TO_PASS, PASS_TO_PASS: row.PASS_TO_PASS },
      sandgym: () => {
        const parse = LOG_PARSERS[row.repo];
        const statuses = parse
          ? parse(log)
          : statusesOfOutcomes(row.repo, Object.entries(row.reported ?? {}));
        return Promise.resolve(
          sweBenchReport({ failToPass: row.FAIL_TO_PASS, passToPass: row.PASS_TO_PASS }, (id) =>
            statusOf(statuses, id),
          ),
        );
      },
      harness: (answer) => ({
        failToPass: answer['failToPass'],
        passToPass: answer['passToPass'],
        resolved: answer['resolved'],
      }),
    };
  });
}

// -- Harbor: reward.txt and reward.json ------------------------------------------------------

/** The task's reward range is sandgym's own bound, which Harbor has none of: read without one. */
const ANY_REWARD: readonly [number, number] = [-Infinity, Infinity];

function rewardCases(): GoldenCase[] {
  const dir = join(CORPUS, 'reward');
  return listed(dir).map((name) => {
    const files = Object.fromEntries(
      listed(join(dir, name)).map((file) => [file, readFileSync(join(dir, name, file), 'utf8')]),
    );
    return {
      id: `reward/${name}`,
      kind: 'reward',
      input: { files },
      sandgym: () => {
        const file = rewardFileToRead(Object.keys(files))!;
        try {
          const { reward, metrics } = parseReward(files[file]!, file === 'reward.json', ANY_REWARD);
          return Promise.resolve({ rewards: metrics ?? { reward } });
        } catch {
          return Promise.resolve({ rejected: true });
        }
      },
      harness: (answer) => ('error' in answer ? { rejected: true } : answer),
    };
  });
}

// -- Task files: Harbor's task.toml, Terminal-Bench's task.yaml ------------------------------

const scratch: string[] = [];

/** A task folder with everything its format needs besides the file under test. */
async function taskFolder(file: string, text: string, others: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'sandgym-golden-'));
  scratch.push(dir);
  for (const [path, content] of Object.entries({ ...others, [file]: text })) {
    await mkdir(join(dir, path, '..'), { recursive: true });
    await writeFile(join(dir, path), content);
  }
  return dir;
}

const HARBOR_FILES = {
  'instruction.md': 'Do the task.\n',
  'environment/Dockerfile': 'FROM busybox:latest\n',
  'tests/test.sh': 'echo 1 > /logs/verifier/reward.txt\n',
};
const TB_FILES = { Dockerfile: 'FROM busybox:latest\n', 'run-tests.sh': 'pytest -rA /tests\n' };

/** What sandgym's loader made of a task, in the terms the harness's model is read in. */
async function loaded(load: () => Promise<Task>, pick: (task: Task) => unknown): Promise<unknown> {
  try {
    return pick(await load());
  } catch {
    return { rejected: true };
  }
}

/** Task folders of the repository's own: each must load under the harness's model as under sandgym's. */
function taskFolders(file: string): string[] {
  const roots = [
    'test/fixtures/tasks/harbor',
    'test/fixtures/tasks/terminal-bench',
    'test/hostile/tasks',
    'examples/tasks',
  ];
  return roots.flatMap((root) =>
    listed(join(ROOT, root))
      .map((name) => join(ROOT, root, name))
      .filter((dir) => existsSync(join(dir, file))),
  );
}

function harborTaskCases(): GoldenCase[] {
  const pick = (task: Task) => ({
    verifierTimeoutSec: task.verifierTimeoutMs / 1000,
    workdir: task.workdir ?? null,
    healthcheck: task.healthcheck ?? null,
    mcpServers: task.mcpServers ?? [],
  });
  const harness = (answer: Record<string, unknown>) =>
    'error' in answer
      ? { rejected: true }
      : {
          verifierTimeoutSec: answer['verifierTimeoutSec'],
          workdir: answer['workdir'],
          healthcheck: answer['healthcheck'],
          // Harbor's dump has url and command as null where sandgym leaves them out
          mcpServers: (answer['mcpServers'] as Record<string, unknown>[]).map((server) =>
            Object.fromEntries(Object.entries(server).filter(([, value]) => value !== null)),
          ),
        };
  const corpus = join(CORPUS, 'harbor-task');
  return [
    ...listed(corpus, '.toml').map((file): GoldenCase => {
      const toml = readFileSync(join(corpus, file), 'utf8');
      return {
        id: `harbor-task/${basename(file, '.toml')}`,
        kind: 'harbor-task',
        input: { toml },
        sandgym: async () =>
          loaded(async () => loadHarborTask(await taskFolder('task.toml', toml, HARBOR_FILES)), pick),
        harness,
      };
    }),
    ...taskFolders('task.toml').map((dir): GoldenCase => ({
      id: `harbor-task/${dir.slice(ROOT.length + 1)}`,
      kind: 'harbor-task',
      input: { toml: readFileSync(join(dir, 'task.toml'), 'utf8') },
      sandgym: () => loaded(() => loadHarborTask(dir), pick),
      harness,
    })),
  ];
}

function terminalBenchTaskCases(): GoldenCase[] {
  const pick = (task: Task) => ({
    instruction: task.instruction,
    maxAgentTimeoutSec: task.agentTimeoutMs / 1000,
    maxTestTimeoutSec: task.verifierTimeoutMs / 1000,
  });
  const harness = (answer: Record<string, unknown>) =>
    'error' in answer
      ? { rejected: true }
      : {
          instruction: answer['instruction'],
          maxAgentTimeoutSec: answer['maxAgentTimeoutSec'],
          maxTestTimeoutSec: answer['maxTestTimeoutSec'],
        };
  const corpus = join(CORPUS, 'tb-task');
  const cases: GoldenCase[] = [];
  for (const file of listed(corpus, '.yaml')) {
    const yaml = readFileSync(join(corpus, file), 'utf8');
    const folder = taskFolder('task.yaml', yaml, TB_FILES);
    cases.push({
      id: `tb-task/${basename(file, '.yaml')}`,
      kind: 'tb-task',
      // the harness reads the file from the folder sandgym loads, made before the script runs
      input: { path: folder.then((dir) => join(dir, 'task.yaml')) },
      sandgym: async () => loaded(async () => loadTerminalBenchTask(await folder), pick),
      harness,
    });
  }
  for (const dir of taskFolders('task.yaml'))
    cases.push({
      id: `tb-task/${dir.slice(ROOT.length + 1)}`,
      kind: 'tb-task',
      input: { path: join(dir, 'task.yaml') },
      sandgym: () => loaded(() => loadTerminalBenchTask(dir), pick),
      harness,
    });
  return cases;
}

// -- the run --------------------------------------------------------------------------------

const CASES = [
  ...pytestCases(),
  ...sweBenchCases(),
  ...rewardCases(),
  ...harborTaskCases(),
  ...terminalBenchTaskCases(),
];
let answer: HarnessAnswer;

beforeAll(async () => {
  if (!existsSync(PYTHON))
    throw new Error(`${PYTHON} is missing: the test set-up makes it (scripts/prepare.sh --for-tests)`);
  const cases = await Promise.all(
    CASES.map(async (c) => ({
      id: c.id,
      kind: c.kind,
      ...Object.fromEntries(
        await Promise.all(
          Object.entries(c.input).map(async ([k, v]): Promise<[string, unknown]> => [k, await v]),
        ),
      ),
    })),
  );
  const stdout = execFileSync(PYTHON, [join(ROOT, 'test/support/harness_golden.py')], {
    input: JSON.stringify({ cases }),
    maxBuffer: 64 << 20,
    encoding: 'utf8',
  });
  answer = JSON.parse(stdout) as HarnessAnswer;
});

afterAll(async () => {
  for (const dir of scratch) await rm(dir, { recursive: true, force: true });
});

describe.each(['pytest', 'swebench', 'reward', 'harbor-task', 'tb-task'] as const)('%s', (kind) => {
  it.each(CASES.filter((c) => c.kind === kind).map((c) => [c.id, c] as const))('%s', async (id, c) => {
    const result = answer.results[id]!;
    if ('unavailable' in result) {
      // only on a machine with no Python >= 3.12 (scripts/harness-venv.sh)
      console.warn(`${id}: the harness cannot run here: ${String(result['unavailable'])}`);
      return;
    }
    const ours = await c.sandgym();
    const theirs = c.harness(result);
    if (DIFFERS[id]) expect(ours, DIFFERS[id]).not.toEqual(theirs);
    else expect(ours).toEqual(theirs);
  });
});
