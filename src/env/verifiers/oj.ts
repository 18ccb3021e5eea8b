import type { OjCase } from '../tasks/task.ts';
import { GradingAnomaly, outputTails, timedTests, type Verifier } from './chain.ts';

/** Reward 1 when a command exits 0 in the grader, else 0. */
export function exitCodeVerifier(argv: string[], timeoutMs: number): Verifier {
  return async (context) => {
    const { grader, workdir, deadline } = context;
    const run = await timedTests(context, () =>
      grader.exec(argv, { ...deadline.call(timeoutMs), cwd: workdir }),
    );
    if (run.timedOut)
      throw new GradingAnomaly('timeout', `The verifier command ran out of its ${timeoutMs} ms`);
    return {
      reward: run.exitCode === 0 ? 1 : 0,
      details: {
        reason: `the verifier command exited ${run.exitCode ?? run.signal}`,
        exitCode: run.exitCode,
        ...outputTails(run),
      },
    };
  };
}

/** Output as judges compare it: trailing spaces on each line and trailing blank lines ignored. */
export function normaliseOutput(text: string): string {
  return text
    .split('\n')
    .map((line) => line.replace(/\s+$/, ''))
    .join('\n')
    .replace(/\n+$/, '');
}

/**
 * OJ: takes the agent's program from the grader, then judges each case as a stateless FnCall in a
 * warm sandbox of the clean environment (so nothing the agent changed besides its program takes
 * part), with the case's stdin and time limit and the task's memory limit. Reward 1 only when
 * every case matches.
 */
export function ojVerifier(program: string, run: string[], cases: OjCase[], caseTimeoutMs: number): Verifier {
  return async (context) => {
    const { grader, workdir, platform, environment, task, deadline } = context;
    const source = await grader.readFile(program, deadline.call()).catch(() => undefined);
    if (!source)
      return {
        reward: 0,
        details: {
          reason: `no program at ${program}`,
          cases: cases.map(() => 'no_program'),
          passed: 0,
          total: cases.length,
        },
      };
    const judge = await platform.createSandbox({
      backend: 'fncall',
      environment,
      resources: { cpu: task.resources.cpu, memoryMib: task.resources.memoryMib },
    });
    try {
      await judge.writeFile(program, source, { ...deadline.call(), mode: 0o755 });
      const statuses: string[] = [];
      for (const testCase of cases) {
        const result = await timedTests(context, () =>
          judge.exec(run, { ...deadline.call(caseTimeoutMs), stdin: testCase.stdin, cwd: workdir }),
        );
        statuses.push(
          result.timedOut
            ? 'time_limit'
            : result.oomKilled
              ? 'memory_limit'
              : result.exitCode !== 0
                ? 'runtime_error'
                : normaliseOutput(result.stdout) === normaliseOutput(testCase.stdout)
                  ? 'accepted'
                  : 'wrong_answer',
        );
      }
      const passed = statuses.filter((s) => s === 'accepted').length;
      return {
        reward: passed === cases.length ? 1 : 0,
        details: {
          reason: `${passed} of ${cases.length} cases accepted`,
          cases: statuses,
          passed,
          total: cases.length,
          judgedBy: 'fncall',
        },
      };
    } finally {
      await judge.close();
    }
  };
}
