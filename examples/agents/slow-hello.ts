// An agent module for `sandgym eval --agent` on examples/tasks/hello-file that takes its time:
// it counts its own steps in /tmp/steps, one line per counted step, and thinks for a second
// before each step after the first, so a test can kill the eval between steps and check, after
// the resumed run, that no counted step ran twice. Its last step before the answer is a slow
// command (`sleep 2`), so a test can also kill the eval in the middle of a step.
import { setTimeout as sleep } from 'node:timers/promises';
import type { SandboxAction } from '../../src/env/index.ts';
import { scriptedAgent, type Agent } from '../../src/rollout/index.ts';

export const COUNTED_STEPS = 3;
const THINKING_MS = 1_000;

const counted: SandboxAction[] = Array.from({ length: COUNTED_STEPS }, () => ({
  type: 'exec' as const,
  command: 'echo step >> /tmp/steps',
}));
/** The index of the slow step, which comes right after the counted ones. */
export const SLOW_STEP = counted.length;

export default (): Agent => {
  const script = scriptedAgent([
    ...counted,
    { type: 'exec', command: ['sleep', '2'] },
    { type: 'exec', command: 'printf "hello sandgym\\n" > /app/hello.txt && wc -l < /tmp/steps' },
    { type: 'submit' },
  ]);
  return async (observation, context) => {
    if (context.stepIndex > 0 && context.stepIndex <= SLOW_STEP) await sleep(THINKING_MS);
    return script(observation, context);
  };
};
