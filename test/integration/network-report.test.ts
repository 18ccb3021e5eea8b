import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadHarborTask, networkReportOf, type Task } from '../../src/env/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';

/** A shell line that opens a TCP connection to ADDRESS:PORT with bash alone (no curl in the image). */
function connect(address: string, port: number): string {
  return `timeout 5 bash -c 'exec 3<>/dev/tcp/${address}/${port}' 2>/dev/null || true`;
}

/**
 * The hello-file task, whose test first reaches for `reach` (shell lines), then grades as before;
 * the agent and its tests may reach the stand-in mirror on port 8080 only.
 */
function taskReaching(dir: string, reach: string[]): Promise<Task> {
  cpSync(resolve(import.meta.dirname, '../../examples/tasks/hello-file'), dir, { recursive: true });
  writeFileSync(
    join(dir, 'tests', 'test.sh'),
    [
      '#!/bin/bash',
      ...reach,
      'if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello sandgym" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt',
      '',
    ].join('\n'),
  );
  return loadHarborTask(dir).then((task) => ({
    ...task,
    network: { setup: [], agent: ['mirror:test'], verify: ['mirror:test'] },
  }));
}

describe('network report', () => {
  let env: TestPlatform;
  let upstream: Upstream;
  const dirs: string[] = [];

  beforeAll(async () => {
    upstream = await startUpstream(7, [8080, 8081]);
    env = await createTestPlatform('network-report', {
      networkRules: { 'mirror:test': [`${upstream.address}:8080`] },
    });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
    await upstream?.[Symbol.asyncDispose]();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  function scratch(): string {
    const dir = mkdtempSync(join(tmpdir(), 'sandgym-netreport-'));
    dirs.push(dir);
    return join(dir, 'task');
  }

  it("names the destinations the agent and the tests were denied, each in its stage's record", async () => {
    const task = await taskReaching(scratch(), [connect(upstream.address, 8081)]);
    await using taskEnv = TaskEnv.create(env.platform, task);
    await taskEnv.reset();
    await taskEnv.step({ type: 'exec', command: ['bash', '-c', connect('10.250.7.9', 4443)] });
    const grade = await taskEnv.grade();
    expect(networkReportOf(grade.details)).toEqual({
      agent: { denied: ['10.250.7.9:4443/tcp'], unresolved: [] },
      grader: { denied: [`${upstream.address}:8081/tcp`], unresolved: [] },
    });
  });

  it('reports nothing when every destination was allowed', async () => {
    const task = await taskReaching(scratch(), [connect(upstream.address, 8080)]);
    await using taskEnv = TaskEnv.create(env.platform, task);
    await taskEnv.reset();
    await taskEnv.step({ type: 'exec', command: ['bash', '-c', connect(upstream.address, 8080)] });
    const grade = await taskEnv.grade();
    expect(grade.details['network']).toBeUndefined();
  });
});
