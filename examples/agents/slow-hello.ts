// An agent module for `sandgym eval --agent` on examples/tasks/hello-file that takes its time:
// it counts its own steps in /tmp/steps, one line per counted step, each followed by a pause
// step, so a test can kill the eval during a pause and check, after the resumed run, that no
// counted step ran twice.
import type { SandboxAction } from '../../src/env/index.ts';
import { scriptedAgent, type Agent } from '../../src/rollout/index.ts';

export const COUNTED_STEPS = 3;

const counted: SandboxAction[] = Array.from({ length: COUNTED_STEPS }, () => [
  { type: 'exec' as const, command: 'echo step >> /tmp/steps' },
  { type: 'exec' as const, command: ['sleep', '1'] },
]).flat();

export default (): Agent =>
  scriptedAgent([
    ...counted,
    { type: 'exec', command: 'printf "hello sandgym\\n" > /app/hello.txt && wc -l < /tmp/steps' },
    { type: 'submit' },
  ]);
