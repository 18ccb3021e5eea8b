import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve as resolvePath } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadHarborTask, networkReportOf, type Task } from '../../src/env/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { startFakeResolverIn } from '../support/fake-resolver.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';

/** The upstream's address (see startUpstream), where the stand-in resolver listens too. */
const RESOLVER = '10.250.7.2';

/** Points the sandbox's resolver at the node's `dns` rule, then asks for NAME. */
function resolve(name: string): string {
  return `echo nameserver ${RESOLVER} > /etc/resolv.conf; getent hosts ${name} || true`;
}

/** A shell line that opens a TCP connection to ADDRESS:PORT with bash alone (no curl in the image). */
function connect(address: string, port: number): string {
  return `timeout 5 bash -c 'exec 3<>/dev/tcp/${address}/${port}' 2>/dev/null || true`;
}

/**
 * The hello-file task, whose test first reaches for `reach` (shell lines), then grades as before;
 * the agent and its tests may reach the stand-in mirror on port 8080 only, and the tests may
 * resolve names.
 */
function taskReaching(dir: string, reach: string[]): Promise<Task> {
  cpSync(resolvePath(import.meta.dirname, '../../examples/tasks/hello-file'), dir, { recursive: true });
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
    network: { setup: [], agent: ['mirror:test'], verify: ['mirror:test', 'dns'] },
  }));
}

describe('network report', () => {
  let env: TestPlatform;
  let upstream: Upstream;
  let resolver: Awaited<ReturnType<typeof startFakeResolverIn>>;
  const dirs: string[] = [];

  beforeAll(async () => {
    upstream = await startUpstream(7, [8080, 8081]);
    resolver = await startFakeResolverIn('sandgym-test-upstream7', RESOLVER);
    env = await createTestPlatform('network-report', {
      networkRules: { 'mirror:test': [`${upstream.address}:8080`], dns: [`${RESOLVER}:53`] },
    });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
    await resolver?.[Symbol.asyncDispose]();
    await upstream?.[Symbol.asyncDispose]();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  function scratch(): string {
    const dir = mkdtempSync(join(tmpdir(), 'sandgym-netreport-'));
    dirs.push(dir);
    return join(dir, 'task');
  }

  it("names the hosts the agent and the tests were denied or could not resolve, each in its stage's record", async () => {
    const task = await taskReaching(scratch(), [
      connect(upstream.address, 8081),
      resolve('no-such-mirror.invalid'),
    ]);
    await using taskEnv = TaskEnv.create(env.platform, task);
    await taskEnv.reset();
    // the agent's stage has no dns rule: its query is refused, and the name kept
    const agentSide = `${connect('10.250.7.9', 4443)}; ${resolve('agent-asked.example')}`;
    await taskEnv.step({ type: 'exec', command: ['bash', '-c', agentSide] });
    const grade = await taskEnv.grade();
    expect(networkReportOf(grade.details)).toEqual({
      agent: { denied: ['10.250.7.9:4443/tcp'], unresolved: ['agent-asked.example'] },
      grader: { denied: [`${upstream.address}:8081/tcp`], unresolved: ['no-such-mirror.invalid'] },
    });
    // the resolver was asked only what the tests, whose rules name it, asked
    const asked = resolver.asked;
    expect(asked).toContain('no-such-mirror.invalid');
    expect(asked).not.toContain('agent-asked.example');
  });

  it('names what a failing RUN step was denied or could not resolve in its error', async () => {
    const dir = scratch();
    const task = await taskReaching(dir, []);
    writeFileSync(
      join(dir, 'environment', 'Dockerfile'),
      [
        'FROM debian:bookworm-slim',
        `RUN ${connect(upstream.address, 8081)}; ${resolve('pkg.invalid')}; getent hosts pkg.invalid`,
        '',
      ].join('\n'),
    );
    await using taskEnv = TaskEnv.create(env.platform, task);
    await expect(taskEnv.reset()).rejects.toThrow(
      new RegExp(
        `could not resolve pkg\\.invalid; denied ${upstream.address.replaceAll('.', '\\.')}:8081/tcp`,
      ),
    );
  });

  it('reports nothing when every destination was allowed', async () => {
    const task = await taskReaching(scratch(), [connect(upstream.address, 8080), resolve('mirror.example')]);
    await using taskEnv = TaskEnv.create(env.platform, task);
    await taskEnv.reset();
    await taskEnv.step({ type: 'exec', command: ['bash', '-c', connect(upstream.address, 8080)] });
    const grade = await taskEnv.grade();
    expect(grade.details['network']).toBeUndefined();
    const asked = resolver.asked;
    expect(asked).toContain('mirror.example');
  });
});
