import { existsSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';
import { composeServices } from './compose.ts';
import { readTaskFile, readTaskText, taskPath } from './task-file.ts';
import { PUBLIC_NETWORK, taskNumber, type Task } from './task.ts';

/**
 * task.yaml of a Terminal-Bench 1 task. The instruction is `instruction`, or in older tasks the
 * `base` entry of `descriptions`; timeouts default as the harness has them.
 */
const taskYamlSchema = z
  .object({
    instruction: z.string().min(1).optional(),
    descriptions: z.array(z.object({ key: z.string(), description: z.string() })).optional(),
    // the metadata Terminal-Bench's Task model requires or types; sandgym reads none of it
    difficulty: z.enum(['easy', 'medium', 'hard', 'unknown'], {
      message: 'difficulty is one of easy, medium, hard (Terminal-Bench requires it)',
    }),
    author_name: z.string().optional(),
    author_email: z.string().optional(),
    category: z.string().optional(),
    tags: z.array(z.string()).optional(),
    disable_asciinema: z.boolean().optional(),
    estimated_duration_sec: z.number().nullable().optional(),
    expert_time_estimate_min: z.number().int().nullable().optional(),
    junior_time_estimate_min: z.number().int().nullable().optional(),
    parser_name: z
      .enum(['pytest'], { message: 'the pytest parser is the one Terminal-Bench tasks use' })
      .default('pytest'),
    max_agent_timeout_sec: taskNumber.timeoutSeconds().default(360),
    max_test_timeout_sec: taskNumber.timeoutSeconds().default(60),
    run_tests_in_same_shell: z.boolean().default(false),
    /**
     * sandgym's own key: where the tests run. The harness always runs them in the agent's
     * container; sandgym grades in a fresh one unless this says `shared` (or the task runs its
     * tests in the agent's very shell), for tests that check what the agent left running.
     */
    sandgym_verifier_mode: z.enum(['fresh', 'shared']).optional(),
  })
  .passthrough();

/** Where the harness puts the tests (and run-tests.sh), and what $TEST_DIR says. */
export const TERMINAL_BENCH_TEST_DIR = '/tests';
/** Where the oracle's solution script goes. */
const ORACLE_SCRIPT = '/oracle/solution.sh';

/** A solution.yaml: commands the oracle types, in order. */
const solutionYamlSchema = z.array(
  z
    .object({
      command: z.string(),
      min_timeout_sec: z.number().nonnegative().optional(),
      block: z.boolean().optional(),
      append_enter: z.boolean().optional(),
    })
    .passthrough(),
);

/** True when the folder looks like one Terminal-Bench 1 task (task.yaml beside a Dockerfile). */
export function isTerminalBenchTask(dir: string): boolean {
  return existsSync(join(dir, 'task.yaml')) && existsSync(join(dir, 'Dockerfile'));
}

/**
 * The oracle's script: solution.sh as it is, or solution.yaml's commands one after another in
 * one shell, as the harness types them into one terminal (so a `cd` carries over).
 */
async function oracleScript(dir: string): Promise<string | undefined> {
  if (existsSync(join(dir, 'solution.sh'))) return readTaskText(dir, 'solution.sh');
  const yamlPath = join(dir, 'solution.yaml');
  if (!existsSync(yamlPath)) return undefined;
  const commands = parseAt(solutionYamlSchema, await readTaskFile(dir, 'solution.yaml', 'YAML'), yamlPath);
  return `${commands.map((c) => c.command).join('\n')}\n`;
}

/**
 * Loads one Terminal-Bench 1 task folder. Its Dockerfile (context: the folder) is the agent's
 * environment; tests/ and run-tests.sh go to /tests in the grader only, where `bash
 * /tests/run-tests.sh` runs from the image's WORKDIR with TEST_DIR=/tests, and its output is read
 * by the pytest parser: reward 1 when the short test summary lists tests and every one passed.
 * Every error names the file and the field to fix.
 */
export async function loadTerminalBenchTask(path: string): Promise<Task> {
  const dir = resolve(path);
  const yamlPath = join(dir, 'task.yaml');
  const yaml = parseAt(taskYamlSchema, await readTaskFile(dir, 'task.yaml', 'YAML'), yamlPath);
  const instruction = yaml.instruction ?? yaml.descriptions?.find((d) => d.key === 'base')?.description;
  if (!instruction)
    throw new SandgymError(
      'invalid_argument',
      `${yamlPath}: give the task's instruction (an "instruction" field, or a "descriptions" entry with key "base")`,
    );
  if (!existsSync(join(dir, 'run-tests.sh')))
    throw new SandgymError(
      'invalid_argument',
      `Task ${dir} has no run-tests.sh: a Terminal-Bench task needs task.yaml, Dockerfile and run-tests.sh`,
    );
  const services = await composeServices(dir, dir);
  const script = await oracleScript(dir);
  return {
    id: basename(dir),
    format: 'terminal-bench',
    source: dir,
    instruction,
    // every file and folder the task names is found beneath its folder: none may be a host's
    environment: {
      kind: 'dockerfile',
      dockerfile: await taskPath(dir, 'Dockerfile'),
      context: dir,
      root: dir,
    },
    ...(services.length ? { services } : {}),
    grading: {
      kind: 'test_log',
      testsDir: existsSync(join(dir, 'tests')) ? await taskPath(dir, 'tests') : undefined,
      runTests: await taskPath(dir, 'run-tests.sh'),
      parser: yaml.parser_name,
    },
    resources: { cpu: 1, memoryMib: 2048 },
    env: { TEST_DIR: TERMINAL_BENCH_TEST_DIR },
    agentTimeoutMs: yaml.max_agent_timeout_sec * 1000,
    verifierTimeoutMs: yaml.max_test_timeout_sec * 1000,
    // the harness's containers are on Docker's default network: public
    network: { setup: [...PUBLIC_NETWORK], agent: [...PUBLIC_NETWORK], verify: [...PUBLIC_NETWORK] },
    hiddenPaths: [TERMINAL_BENCH_TEST_DIR, '/oracle'],
    verifierMode: yaml.sandgym_verifier_mode ?? (yaml.run_tests_in_same_shell ? 'shared' : 'fresh'),
    oracle: script === undefined ? undefined : { kind: 'shell', path: ORACLE_SCRIPT, script },
  };
}
