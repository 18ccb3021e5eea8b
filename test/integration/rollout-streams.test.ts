import { resolve } from 'node:path';
import { toArray, firstValueFrom } from 'rxjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTasks } from '../../src/env/index.ts';
import {
  RolloutRunner,
  TrainingCoordinator,
  oracleAgent,
  type Agent,
  type EpisodeReport,
  type TrainingEvent,
} from '../../src/rollout/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

describe('rollout streams', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('streams', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('emit every step, episode, reward and sandbox state change, then complete', async () => {
    const tasks = await loadTasks([resolve('examples/tasks')]);
    const runner = new RolloutRunner(env.platform, oracleAgent, { concurrency: 2 });
    const steps = firstValueFrom(runner.steps$.pipe(toArray()));
    const rewards = firstValueFrom(runner.rewards$.pipe(toArray()));
    const lifecycle = firstValueFrom(runner.lifecycle$.pipe(toArray()));
    const pulled: EpisodeReport[] = [];
    const pulling = (async () => {
      for await (const report of runner.finished()) pulled.push(report);
    })();
    const reports = await runner.run(tasks);
    await pulling;
    const ids = ['calc__mean-1', 'fix-sum', 'hello-file', 'oj-reverse-words', 'oj-sum-pairs'];
    expect(reports.map((r) => r.reward)).toEqual([1, 1, 1, 1, 1]);
    expect(pulled.map((r) => r.task).sort()).toEqual(ids);
    expect((await rewards).sort((a, b) => a.task.localeCompare(b.task))).toEqual(
      ids.map((task) => ({ task, reward: 1 })),
    );
    const all = await steps;
    for (const task of ['fix-sum', 'hello-file']) {
      const mine = all.filter((s) => s.task === task);
      // the platform staged the oracle's solution: its steps run it, then submit
      expect(mine.map((s) => s.stepIndex)).toEqual([0, 1]);
      expect(mine.map((s) => s.action.type)).toEqual(['exec', 'submit']);
      // each step carries what a trainer needs: what was done, what came back, its audit and timing
      const [exec] = mine;
      expect(exec?.observation).toMatchObject({ type: 'exec', exitCode: 0 });
      expect(exec?.signals).toMatchObject({ deniedEgress: 0, limitsHit: [] });
      expect(exec?.platformMs).toBeGreaterThan(0);
      expect(reports.find((r) => r.task === task)?.trajectory?.map((s) => s.stepIndex)).toEqual([0, 1]);
      expect(mine.at(-1)?.reward).toBe(1);
      // where its time went: every phase an oracle episode passes, within its wall time
      const report = reports.find((r) => r.task === task)!;
      const timings = report.timings ?? {};
      for (const phase of ['create', 'step', 'command', 'diff', 'graderCreate', 'tests', 'teardown'] as const)
        expect(timings[phase], `${task}: ${phase}`).toBeGreaterThan(0);
      const summed = Object.values(timings).reduce((a, b) => a + b, 0);
      expect(summed).toBeLessThanOrEqual(report.durationMs + (timings.teardown ?? 0) + 1);
      expect(report.overheadMs).toBeGreaterThan(0);
      expect(report.overheadMs).toBeLessThan(summed);
      expect(exec?.agentMs).toBeGreaterThanOrEqual(0);
    }
    const states = await lifecycle;
    expect(states.filter((s) => s.state === 'running')).toHaveLength(5);
    expect(states.filter((s) => s.state === 'stopped')).toHaveLength(5);
    for (const running of states.filter((s) => s.state === 'running')) {
      expect(states.indexOf(running)).toBeLessThan(
        states.findIndex((s) => s.sandboxId === running.sandboxId && s.state === 'stopped'),
      );
    }
  });

  it('put their sandboxes in a run, whose preemption hibernates them mid-episode, in one stream', async () => {
    const [task] = await loadTasks([resolve('examples/tasks/hello-file')]);
    const coordinator = await TrainingCoordinator.start(env.platform, {
      name: 'streams-run',
      leaseMs: 60_000,
    });
    // the agent holds its first decision until the test lets it go: the episode's sandbox sits idle
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let thinking!: () => void;
    const isThinking = new Promise<void>((resolve) => (thinking = resolve));
    const oracle = oracleAgent();
    const slowOracle: Agent = async (observation, context) => {
      if (context.stepIndex === 0) {
        thinking();
        await held;
      }
      return oracle(observation, context);
    };
    const agent = Object.assign(slowOracle, { isOracle: true });
    const runner = new RolloutRunner(env.platform, () => agent, { concurrency: 1, run: coordinator.name });
    const events = firstValueFrom(coordinator.events$(runner).pipe(toArray()));
    try {
      const running = runner.run([task!]);
      await isThinking;
      const preempted = await coordinator.phase('preempted');
      // hibernated, or (on the node network, where CRIU cannot go, with no swap) only paused, and said so
      const how = preempted.hibernated.length ? 'hibernated' : 'paused';
      expect(preempted[how]).toHaveLength(1);
      const [sandboxId] = preempted[how];
      if (how === 'paused') expect(preempted.keptMemory).toMatchObject([{ sandboxId, reason: /resident/ }]);
      expect((await env.platform.attachSandbox(sandboxId!)).state).toBe(how);
      expect((await coordinator.phase('rollout')).resumed).toEqual([sandboxId]);
      release();
      const [report] = await running;
      expect(report?.reward).toBe(1);
      await coordinator.end();
      const seen = (await events).map(summary);
      expect(seen).toEqual([
        `rollout ${sandboxId} running`,
        'phase preempted',
        `run ${sandboxId} ${how}`,
        'phase rollout',
        `run ${sandboxId} running`,
        `rollout ${sandboxId} stopped`,
      ]);
    } finally {
      release();
      await coordinator.end();
    }
  });
});

function summary(event: TrainingEvent): string {
  return event.kind === 'phase'
    ? `phase ${event.event.phase}`
    : `${event.source} ${event.event.sandboxId} ${event.event.state}`;
}
