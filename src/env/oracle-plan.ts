import type { SandboxAction } from '../platform/index.ts';
import { HARBOR_SOLUTION_DIR } from './tasks/harbor.ts';
import type { Task } from './tasks/task.ts';

/**
 * What a task's oracle does, in order, before it submits: for a Harbor task, runs solve.sh from
 * the solution folder the platform staged at /solution, as Harbor does, from the image's working
 * directory (solutions write relative paths such as `answer.txt` and expect them in WORKDIR),
 * through bash whether or not it is executable; for a Terminal-Bench task, runs its staged
 * solution script with bash, also from WORKDIR; for an OJ problem, writes the reference program;
 * for SWE-bench, applies the gold patch. Empty for a task without an oracle. The env layer needs
 * it too: grading runs the oracle to tell a broken verifier from an unresolved starting state.
 */
export function oraclePlan(task: Task): SandboxAction[] {
  const oracle = task.oracle;
  switch (oracle?.kind) {
    case 'program':
      return [{ type: 'write_file', path: oracle.path, content: oracle.content }];
    case 'patch':
      return [
        { type: 'write_file', path: '/tmp/sandgym-oracle.patch', content: oracle.patch },
        { type: 'exec', command: ['git', '-C', oracle.repoPath, 'apply', '/tmp/sandgym-oracle.patch'] },
        { type: 'exec', command: ['rm', '-f', '/tmp/sandgym-oracle.patch'] },
      ];
    case 'script':
      return [
        {
          type: 'exec',
          command: `if command -v bash >/dev/null; then bash ${HARBOR_SOLUTION_DIR}/solve.sh; else sh ${HARBOR_SOLUTION_DIR}/solve.sh; fi`,
          ...(oracle.env && Object.keys(oracle.env).length ? { env: oracle.env } : {}),
        },
      ];
    case 'shell':
      return [{ type: 'exec', command: ['bash', oracle.path] }];
    default:
      return [];
  }
}
