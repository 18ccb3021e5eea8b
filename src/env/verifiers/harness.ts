import { fileURLToPath } from 'node:url';
import type { Sandbox } from '../../platform/index.ts';
import type { Deadline } from '../deadline.ts';
import { stageFolder } from '../stage-folder.ts';
import type { VerifyContext } from './chain.ts';

/**
 * Where a grader keeps sandgym's own Python harness: the import guard, the pytest reporter and a
 * sitecustomize that installs the guard. Under /sandgym-runner, which grading never takes from
 * the agent's diff, so nothing of the agent's can sit beside them.
 */
export const HARNESS_DIR = '/sandgym-runner/py';

const HARNESS_SOURCE = fileURLToPath(new URL('./harness', import.meta.url));

/** Stages the harness into a grader; every verifier does, before the tests run. */
export function stageHarness(grader: Sandbox, deadline: Deadline): Promise<void> {
  return stageFolder(grader, HARNESS_SOURCE, HARNESS_DIR, deadline);
}

/**
 * The variables a verifier's command runs with: `variables` (the task's), plus the harness first
 * on PYTHONPATH (so every Python process of the run installs the import guard and pytest loads
 * the reporter; the task's or image's own PYTHONPATH stays after it), and the agent's workdir
 * named as untrusted for the guard.
 */
export function harnessEnv(
  context: Pick<VerifyContext, 'workdir' | 'task' | 'imageEnv'>,
  variables: Record<string, string>,
): Record<string, string> {
  // the command's own, else the sandbox's (the task's over the image's), as exec would lay them
  const pythonPath =
    variables['PYTHONPATH'] ?? context.task.env['PYTHONPATH'] ?? context.imageEnv['PYTHONPATH'];
  return {
    ...variables,
    PYTHONPATH: pythonPath ? `${HARNESS_DIR}:${pythonPath}` : HARNESS_DIR,
    // the root is every folder's ancestor: naming it would distrust the interpreter's own
    ...(context.workdir === '/' ? {} : { SANDGYM_UNTRUSTED_DIRS: context.workdir }),
  };
}
