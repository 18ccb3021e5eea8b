import { chmod, cp, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTasks } from '../../src/env/index.ts';
import { evaluate, nopAgent, oracleAgent } from '../../src/rollout/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

/**
 * A Harbor task shaped like published ones: a WORKDIR-relative solve.sh, a test.sh without its
 * executable bit, variables from [verifier] env and [solution] env, an answer the task asks for
 * under /solution, and a reward.json of several metrics.
 */
async function writeHarborTask(dir: string, marker: string): Promise<void> {
  await mkdir(join(dir, 'environment'), { recursive: true });
  await mkdir(join(dir, 'solution'), { recursive: true });
  await mkdir(join(dir, 'tests'), { recursive: true });
  await writeFile(
    join(dir, 'task.toml'),
    [
      'version = "1.0"',
      '[verifier]',
      'timeout_sec = 60.0',
      `env = { EXPECTED = "${marker}" }`,
      '[solution]',
      `env = { SOLVE_TOKEN = "${marker}" }`,
      '[environment]',
      'cpus = 1',
      'memory_mb = 512',
      'storage_mb = 2048',
      '',
    ].join('\n'),
  );
  await writeFile(
    join(dir, 'instruction.md'),
    'Copy seed.txt to answer.txt and write the token to /solution/answer.txt.\n',
  );
  await writeFile(
    join(dir, 'environment', 'Dockerfile'),
    `FROM debian:bookworm\nWORKDIR /app\nRUN echo ${marker} > seed.txt\n`,
  );
  await writeFile(
    join(dir, 'solution', 'solve.sh'),
    '#!/bin/bash\nset -e\ncp seed.txt answer.txt\necho "$SOLVE_TOKEN" > /solution/answer.txt\n',
  );
  const test = join(dir, 'tests', 'test.sh');
  await writeFile(
    test,
    [
      '#!/bin/bash',
      'ok=0',
      '[ "$(cat /app/answer.txt 2>/dev/null)" = "$EXPECTED" ] && [ "$(cat /solution/answer.txt 2>/dev/null)" = "$EXPECTED" ] && ok=1',
      'echo "checked answer: $ok"',
      'echo "{\\"reward\\": $ok, \\"style\\": 0.5}" > /logs/verifier/reward.json',
      '',
    ].join('\n'),
  );
  await chmod(test, 0o644); // published tasks often lose the bit; Harbor runs it through bash
}

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'tasks', 'harbor');

describe('Harbor tasks as published', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('harbor-format', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('runs solve.sh from WORKDIR with its env, grades answers under /solution, and keeps every metric', async () => {
    // two suites with a task of one name, a third differing only in case: never one environment
    const dirs = [
      join(env.dataDir, 'suite-a', 'hello'),
      join(env.dataDir, 'suite-b', 'hello'),
      join(env.dataDir, 'suite-a', 'Hello'),
    ];
    await Promise.all(dirs.map((dir, i) => writeHarborTask(dir, `marker-${i}`)));
    const tasks = await loadTasks(dirs);
    expect(tasks.map((t) => t.resources.diskMib)).toEqual([2048, 2048, 2048]);

    // one eval per task: an eval refuses two tasks of one id (its results and journal are keyed by id)
    const evalEach = async (agent: typeof oracleAgent) => {
      const reports = [];
      for (const task of tasks)
        reports.push(...(await evaluate(env.platform, [task], agent, { concurrency: 1 })));
      return reports;
    };
    const oracle = await evalEach(oracleAgent);
    for (const report of oracle) {
      expect(report.outcome, report.error).toEqual({ kind: 'ok' });
      expect(report.reward).toBe(1);
      expect(report.details?.['metrics']).toEqual({ reward: 1, style: 0.5 });
      expect(report.details?.['reason']).toMatch(/wrote reward\.json/);
      expect(report.details?.['stdoutTail']).toContain('checked answer: 1');
    }
    const nop = await evalEach(nopAgent);
    expect(nop.map((r) => [r.outcome.kind, r.reward])).toEqual([
      ['ok', 0],
      ['ok', 0],
      ['ok', 0],
    ]);
  });

  it('passes a dozen published-shape folders: users, docker_image, a compose service, apt, metrics', async () => {
    const tasks = await loadTasks([FIXTURES]);
    expect(tasks.map((t) => t.id)).toEqual([
      'apt-pretty-json',
      'args-and-metadata',
      'compose-main',
      'copy-ownership',
      'env-and-storage',
      'image-user',
      'multi-metric',
      'prebuilt-image',
      'pytest-reward',
      'solution-helpers',
      'tests-with-data',
      'verifier-root',
    ]);
    expect(tasks.find((t) => t.id === 'env-and-storage')?.resources).toEqual({
      cpu: 1,
      memoryMib: 512,
      diskMib: 1024,
    });
    expect(tasks.find((t) => t.id === 'verifier-root')).toMatchObject({
      agentUser: 'worker',
      verifierUser: 'root',
    });
    expect(tasks.find((t) => t.id === 'prebuilt-image')?.environment).toEqual({
      kind: 'image',
      ref: 'debian:bookworm',
    });
    const oracle = await evaluate(env.platform, tasks, oracleAgent, { concurrency: 2 });
    expect(oracle.map((r) => [r.task, r.reward, r.outcome.kind, r.error])).toEqual(
      tasks.map((t) => [t.id, 1, 'ok', undefined]),
    );
    // reward.json's metrics are kept each, besides their mean as the reward
    expect(oracle.find((r) => r.task === 'multi-metric')?.details?.['metrics']).toEqual({
      correctness: 1,
      style: 1,
    });
    const nop = await evaluate(env.platform, tasks, nopAgent, { concurrency: 2 });
    expect(nop.map((r) => [r.task, r.reward, r.outcome.kind])).toEqual(tasks.map((t) => [t.id, 0, 'ok']));
  });

  it("takes a compose service whose Dockerfile fails for the task author's error, naming the service", async () => {
    const dir = join(env.dataDir, 'broken-service', 'compose-main');
    await cp(join(FIXTURES, 'compose-main'), dir, { recursive: true });
    await writeFile(join(dir, 'environment', 'web', 'Dockerfile'), 'FROM debian:bookworm\nRUN exit 7\n');
    const [report] = await evaluate(env.platform, await loadTasks([dir]), nopAgent, { concurrency: 1 });
    expect(report?.outcome).toMatchObject({
      kind: 'task_error',
      message: expect.stringMatching(/service "web".*exit/) as unknown,
    });
  });
});
