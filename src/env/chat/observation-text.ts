import type { SandboxObservation } from '../../platform/index.ts';
import type { TaskObservation } from '../task-env.ts';

/** What an observation says, as the text a model would read. */
export function observationText(observation: TaskObservation | SandboxObservation): string {
  switch (observation.type) {
    case 'exec': {
      const status = observation.timedOut
        ? 'timed out'
        : observation.signal
          ? `killed by ${observation.signal}`
          : `exit code ${observation.exitCode}`;
      const streams = [observation.stdout, observation.stderr].map((text) => text.replace(/\n$/, ''));
      return [...streams, `[${status}]`].filter(Boolean).join('\n');
    }
    case 'file':
      return observation.content;
    case 'dir':
      return observation.entries.map((entry) => `${entry.type}\t${entry.size}\t${entry.name}`).join('\n');
    case 'written':
      return `wrote ${observation.path}`;
    case 'submitted':
      return 'submitted';
    case 'error':
      return `error ${observation.code}: ${observation.message}`;
    case 'reset':
    case 'task':
      return JSON.stringify(observation);
  }
}
