import { resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { TaskEnv, loadTasks } from '../../src/env/index.ts';
import { createTestPlatform } from '../support/platform.ts';

describe('FnCall sandboxes', () => {
  it('serve calls of different callers from one warm worker, with nothing of an earlier call left', async () => {
    await using test = await createTestPlatform('fncall');
    const { platform } = test;
    await using first = await platform.createSandbox({ backend: 'fncall', environment: 'busybox:latest' });
    await using second = await platform.createSandbox({ backend: 'fncall', environment: 'busybox:latest' });
    const namespace = (await first.exec(['readlink', '/proc/self/ns/net'])).stdout;
    const left = await first.exec([
      'sh',
      '-c',
      'echo secret > /tmp/secret; echo secret > /dev/shm/secret; setsid sleep 1000 < /dev/null > /dev/null 2>&1 & echo started',
    ]);
    expect(left.stdout).toBe('started\n');
    // the same container serves the next call, cleaned: no file, no process of the earlier one
    expect((await second.exec(['readlink', '/proc/self/ns/net'])).stdout).toBe(namespace);
    const seen = await second.exec(['sh', '-c', 'ls -A /tmp /dev/shm; ps -o comm']);
    expect(seen.stdout).not.toMatch(/secret|sleep/);
    // calls are stateless: what a command wrote is gone, what writeFile gave stays
    await first.writeFile('/work/input.txt', 'kept\n');
    await first.exec(['sh', '-c', 'echo lost > /work/output.txt']);
    expect((await first.exec(['cat', '/work/input.txt'])).stdout).toBe('kept\n');
    expect((await first.exec(['ls', '/work'])).stdout).toBe('input.txt\n');
    await expect(platform.listSandboxes()).resolves.toEqual(
      expect.arrayContaining([expect.objectContaining({ id: first.id, backend: 'fncall' })]),
    );
  });

  it('is reclaimed at its idle TTL, and its handle then says why', async () => {
    await using test = await createTestPlatform('fncall-lifetime');
    const { platform } = test;
    await using idle = await platform.createSandbox({
      backend: 'fncall',
      environment: 'busybox:latest',
      lifetime: { idleTtlMs: 300 },
    });
    expect((await idle.exec(['true'])).exitCode).toBe(0);
    for (let polls = 0; (await platform.listSandboxes()).some((r) => r.id === idle.id); polls++) {
      if (polls > 200) throw new Error('the idle TTL never reclaimed the FnCall sandbox');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(idle.state).toBe('stopped');
    expect(idle.failure).toBe('timeout');
    await expect(idle.exec(['true'])).rejects.toThrow(/stopped \(timeout\)/);
  });

  it('enforces time, memory and output limits per call', async () => {
    await using test = await createTestPlatform('fncall-limits');
    await using judge = await test.platform.createSandbox({
      backend: 'fncall',
      environment: 'busybox:latest',
      resources: { memoryMib: 32, outputCapBytes: 1000 },
    });
    expect((await judge.exec(['sleep', '10'], { timeoutMs: 200 })).timedOut).toBe(true);
    const hog = await judge.exec(['sh', '-c', 'x=$(head -c 100000000 /dev/zero | tr "\\0" a); echo ${#x}']);
    expect(hog.oomKilled).toBe(true);
    const loud = await judge.exec(['sh', '-c', 'head -c 5000 /dev/zero']);
    expect(loud.stdoutTruncated).toBe(true);
    expect(loud.stdoutBytes).toBe(5000);
    await expect(judge.pause()).rejects.toMatchObject({ code: 'unsupported' });
    await expect(test.platform.packDiff(judge, {})).rejects.toMatchObject({ code: 'unsupported' });
  });

  it('judges OJ tasks', async () => {
    await using test = await createTestPlatform('fncall-oj');
    const tasks = await loadTasks([resolve('examples/tasks')]);
    const task = tasks.find((t) => t.id === 'oj-sum-pairs')!;
    const oracle = task.oracle?.kind === 'program' ? task.oracle : undefined;
    await using env = TaskEnv.create(test.platform, task);
    await env.reset();
    await env.step({ type: 'write_file', path: oracle!.path, content: oracle!.content });
    const grade = await env.grade();
    expect(grade.reward).toBe(1);
    expect(grade.details).toMatchObject({ judgedBy: 'fncall', cases: ['accepted', 'accepted', 'accepted'] });
  });
});
