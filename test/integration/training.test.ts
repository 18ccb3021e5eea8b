import { firstValueFrom, toArray } from 'rxjs';
import { describe, expect, it } from 'vitest';
import { TrainingCoordinator } from '../../src/rollout/index.ts';
import { createTestPlatform } from '../support/platform.ts';

describe('TrainingCoordinator', () => {
  it('publishes phases and the sandbox changes they cause, then ends the run', async () => {
    await using test = await createTestPlatform('training');
    const coordinator = await TrainingCoordinator.start(test.platform, { name: 'trainer', leaseMs: 2_000 });
    const phases = firstValueFrom(coordinator.phases$.pipe(toArray()));
    const lifecycle = firstValueFrom(coordinator.lifecycle$.pipe(toArray()));
    const request = { environment: 'busybox:latest', resources: { memoryMib: 64 }, run: coordinator.name };
    const a = await test.platform.createSandbox(request);
    const b = await test.platform.createSandbox(request);
    const ids = [a.id, b.id].sort();
    // the lease is renewed in the background: after several lease periods nothing has lapsed
    await new Promise((resolve) => setTimeout(resolve, 3_500));
    expect((await a.stats()).state).toBe('running');
    await coordinator.phase('train');
    await coordinator.phase('preempted');
    await coordinator.phase('rollout');
    await coordinator.end();
    expect((await phases).map((p) => p.phase)).toEqual(['train', 'preempted', 'rollout']);
    const events = await lifecycle;
    const byState = (state: string, cause: string): string[] =>
      events
        .filter((e) => e.state === state && e.cause === cause)
        .map((e) => e.sandboxId)
        .sort();
    expect(byState('paused', 'phase:train')).toEqual(ids);
    expect(byState('hibernated', 'phase:preempted')).toEqual(ids);
    expect(byState('running', 'phase:rollout')).toEqual(ids);
    expect(byState('stopped', 'end')).toEqual(ids);
    expect(events.map((e) => e.cause)).toEqual([
      'phase:train',
      'phase:train',
      'phase:preempted',
      'phase:preempted',
      'phase:rollout',
      'phase:rollout',
      'end',
      'end',
    ]);
    expect(await test.platform.listSandboxes()).toEqual([]);
  });
});
