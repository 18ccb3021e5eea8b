import { readFile } from 'node:fs/promises';
import { basename } from 'node:path';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';
import { MAX_TASK_TIMEOUT_MS, NO_NETWORK, taskNumber, type Task } from './task.ts';

/** How each OJ language is run; the agent writes its program to `program`. */
const LANGUAGES: Record<string, { environment: string; program: string; run: string[] }> = {
  python3: {
    environment: 'debian:bookworm',
    program: '/work/solution.py',
    run: ['python3', '/work/solution.py'],
  },
  sh: { environment: 'busybox:latest', program: '/work/solution.sh', run: ['sh', '/work/solution.sh'] },
};

/** Judging's time beyond its cases': compiling, staging. */
const JUDGING_OVERHEAD_MS = 10_000;

/** How long judging a problem may take: every case's limit, and the overhead. */
function judgingMs(problem: { time_limit_ms: number; tests: unknown[] }): number {
  return problem.time_limit_ms * problem.tests.length + JUDGING_OVERHEAD_MS;
}

/** An OJ problem file (`*.oj.json`): statement, language, test cases, limits. */
const ojProblemSchema = z
  .object({
    id: z.string().regex(/^[A-Za-z0-9._-]+$/, 'id is letters, digits, ".", "_" and "-"'),
    statement: z.string().min(1),
    language: z.enum(Object.keys(LANGUAGES) as [string, ...string[]]),
    tests: z.array(z.object({ stdin: z.string(), stdout: z.string() })).min(1),
    time_limit_ms: taskNumber.timeoutMs().default(2000),
    memory_limit_mb: taskNumber.memoryMib().default(256),
    /** A reference solution, for the oracle and the checker. */
    solution: z.string().optional(),
  })
  .superRefine((problem, context) => {
    // judging runs every case in turn: its whole budget is a task timeout too
    if (judgingMs(problem) > MAX_TASK_TIMEOUT_MS)
      context.addIssue({
        code: 'custom',
        path: ['time_limit_ms'],
        message: `time_limit_ms × ${problem.tests.length} tests, plus ${JUDGING_OVERHEAD_MS} ms, must come to at most ${MAX_TASK_TIMEOUT_MS} ms (7 days)`,
      });
  });

/** True for a file that names itself an OJ problem. */
export function isOjProblem(path: string): boolean {
  return path.endsWith('.oj.json');
}

/** Loads an OJ problem; errors name the file and the field. */
export async function loadOjProblem(path: string): Promise<Task> {
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(path, 'utf8'));
  } catch (error) {
    throw new SandgymError('invalid_argument', `${path} is not valid JSON: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const problem = parseAt(ojProblemSchema, raw, path);
  const language = LANGUAGES[problem.language]!;
  return {
    id: problem.id || basename(path, '.oj.json'),
    format: 'oj',
    source: path,
    instruction: `${problem.statement}\n\nWrite your ${problem.language} program to ${language.program}. It reads standard input and writes standard output.`,
    environment: { kind: 'stored', ref: language.environment },
    grading: {
      kind: 'oj',
      program: language.program,
      run: language.run,
      cases: problem.tests,
      caseTimeoutMs: problem.time_limit_ms,
    },
    resources: { cpu: 1, memoryMib: problem.memory_limit_mb },
    env: {},
    agentTimeoutMs: 300_000,
    verifierTimeoutMs: judgingMs(problem),
    network: NO_NETWORK,
    hiddenPaths: [],
    oracle:
      problem.solution === undefined
        ? undefined
        : { kind: 'program', path: language.program, content: problem.solution },
  };
}
