import { join, resolve } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadHarborTask, type Task } from '../../src/env/index.ts';
import { waitHealthy } from '../../src/env/healthcheck.ts';
import type { TaskHealthcheck } from '../../src/env/tasks/task.ts';
import { checkTask } from '../../src/rollout/index.ts';
import type { Sandbox } from '../../src/platform/index.ts';
import { HELLO_TASK, debianDockerfile, helloTaskWith } from '../support/task-dirs.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const FIXTURES = resolve(import.meta.dirname, '..', 'fixtures', 'tasks');
const HELLO = HELLO_TASK;

/** Fetches a URL inside a sandbox with Python (every debian:bookworm sandbox has it). */
const fetchArgv = (url: string) => [
  'python3',
  '-c',
  `import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(${JSON.stringify(url)}, timeout=10).read().decode())`,
];

/** The command names of a sandbox's processes, without pid 1 (its agent) and the listing's own shell. */
const LIST_PROCESSES = [
  'sh',
  '-c',
  'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; read -r n < "$d/comm" 2>/dev/null && echo "$n"; done; true',
];

describe('a task sandbox starts as Docker starts its container', () => {
  let env: TestPlatform;
  const opened: (TaskEnv | Sandbox)[] = [];

  beforeAll(async () => {
    env = await createTestPlatform('task-startup', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterEach(async () => {
    for (const thing of opened.splice(0)) await thing.close();
    // every sandbox of the test ended, entrypoints and probes with them
    expect(await env.platform.liveSandboxes()).toEqual([]);
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  const sandbox = async (environment = 'debian:bookworm'): Promise<Sandbox> => {
    const made = await env.platform.createSandbox({ environment });
    opened.push(made);
    return made;
  };

  const taskEnv = (task: Task): TaskEnv => {
    const made = TaskEnv.create(env.platform, task);
    opened.push(made);
    return made;
  };

  const taskDir = (name: string, files: Record<string, string>): Promise<string> =>
    helloTaskWith(env.dataDir, name, files);

  it('resolves localhost and its own hostname in a sandbox without network', async () => {
    const box = await sandbox();
    const localhost = await box.exec(['getent', 'ahosts', 'localhost']);
    expect(localhost.exitCode).toBe(0);
    expect(localhost.stdout).toMatch(/^127\.0\.0\.1\s/m);
    expect(localhost.stdout).toMatch(/^::1\s/m);
    const name = await box.exec(['cat', '/proc/sys/kernel/hostname', '/etc/hostname']);
    expect(name.stdout).toBe('sandbox\nsandbox\n');
    expect((await box.exec(['getent', 'hosts', 'sandbox'])).stdout).toMatch(/^127\.0\.1\.1\s+sandbox/);
    // a server bound by the name answers by the name: what tests of `localhost` servers do
    const served = await box.exec([
      'python3',
      '-c',
      'import socket; s = socket.create_server(("localhost", 0)); c = socket.create_connection(("localhost", s.getsockname()[1])); print("connected")',
    ]);
    expect(served.stdout.trim()).toBe('connected');
  });

  it("keeps the sandbox's /etc/hosts, hostname and resolv.conf out of its diff", async () => {
    const agent = await sandbox();
    // an agent's hosts line pointing a name the grader's tests might use at an address of its own
    await agent.exec([
      'sh',
      '-c',
      'echo "6.6.6.6 pypi.org" >> /etc/hosts && echo evil > /etc/hostname && echo "nameserver 6.6.6.6" > /etc/resolv.conf && mkdir -p /app && echo work > /app/work.txt',
    ]);
    const { layer } = await env.platform.packDiff(agent, {});
    const grader = await env.platform.createSandbox({
      environment: 'debian:bookworm',
      extraLayers: [layer.digest],
    });
    opened.push(grader);
    expect((await grader.readFile('/app/work.txt')).toString()).toBe('work\n');
    const hosts = (await grader.readFile('/etc/hosts')).toString();
    expect(hosts).not.toContain('pypi.org');
    expect(hosts).toMatch(/^127\.0\.0\.1\s+localhost$/m);
    expect((await grader.readFile('/etc/hostname')).toString()).toBe('sandbox\n');
    const resolv = await grader.exec(['cat', '/etc/resolv.conf']);
    expect(resolv.stdout).not.toContain('6.6.6.6');
    // the agent's own sandbox keeps its edits while it runs, as a container does
    expect((await agent.readFile('/etc/hosts')).toString()).toContain('6.6.6.6 pypi.org');
  });

  it('names the compose members in /etc/hosts beside localhost', async () => {
    const task = await loadHarborTask(join(FIXTURES, 'harbor', 'compose-main'));
    const episode = taskEnv(task);
    await episode.reset();
    const box = episode.sandbox!;
    const hosts = await box.exec(['getent', 'hosts', 'web', 'main', 'localhost', 'sandbox']);
    expect(hosts.exitCode).toBe(0);
    const names = hosts.stdout.split('\n').filter(Boolean);
    expect(names).toHaveLength(4);
    expect(names.find((l) => /\sweb$/.test(l))).toMatch(/^\d+\.\d+\.\d+\.\d+\s/);
    expect((await box.exec(fetchArgv('http://web:8000/motd.txt'))).stdout).toBe('welcome to the fixture\n');
  });

  it("refuses a service name that would add hosts lines of its author's", async () => {
    const task = await loadHarborTask(join(FIXTURES, 'harbor', 'compose-main'));
    const [web] = task.services!;
    // built in code, past the compose loader's check: the name would be two lines of /etc/hosts
    const hostile: Task = { ...task, services: [{ ...web!, name: 'web\n6.6.6.6 pypi.org' }] };
    await expect(taskEnv(hostile).reset()).rejects.toThrow(
      /Its service name "web\\n6\.6\.6\.6 pypi\.org" is not a host name/,
    );
    const long: Task = { ...task, services: [{ ...web!, name: 'a'.repeat(64) }] };
    await expect(taskEnv(long).reset()).rejects.toThrow(/is not a host name/);
  });

  it("runs the image's ENTRYPOINT at the agent's start, and grades where it runs", async () => {
    const task = await loadHarborTask(join(FIXTURES, 'checked', 'harbor-entrypoint-daemon'));
    const episode = taskEnv(task);
    await episode.reset();
    const box = episode.sandbox!;
    // the agent's first command finds the server up, by the name the entrypoint added
    expect((await box.exec(fetchArgv('http://tokens.internal/token'))).stdout).toBe(
      'token-entrypoint-7f3a9c\n',
    );
    const running = (await box.exec(LIST_PROCESSES)).stdout.split('\n');
    // the entrypoint exec'd its arguments: the idle command, with the server beside it
    expect(running).toEqual(expect.arrayContaining(['sleep', 'python3']));
    await episode.step({
      type: 'exec',
      command:
        'cp /dev/null /app/token.txt && python3 -c \'import urllib.request; print(urllib.request.urlopen("http://tokens.internal/token").read().decode(), end="")\' > /app/token.txt',
    });
    // graded in place (the task says so): the tests reach the server the entrypoint started
    const { reward, info } = await episode.step({ type: 'submit' });
    expect(info.grade?.details['reason']).toMatch(/wrote reward\.txt 1/);
    expect(reward).toBe(1);
    // the entrypoint's processes are the container's, not something the agent left running
    expect(info.grade?.details['leftoverProcesses']).toEqual([]);
  });

  it('runs no entrypoint in a fresh grader, so none the agent rewrote', async () => {
    const dir = await taskDir('entrypoint-rewrite', {
      'environment/Dockerfile': debianDockerfile(
        'COPY start.sh /opt/start.sh',
        'WORKDIR /app',
        'ENTRYPOINT ["/opt/start.sh"]',
      ),
      'environment/start.sh': '#!/bin/sh\necho original > /tmp/entrypoint-ran\nexec "$@"\n',
      // the tests pay out for any entrypoint's mark: none may run before them in a fresh grader
      'tests/test.sh': [
        '#!/bin/bash',
        'if [ -e /tmp/entrypoint-ran ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt',
        '',
      ].join('\n'),
    });
    const task = await loadHarborTask(dir);
    const episode = taskEnv(task);
    await episode.reset();
    expect((await episode.sandbox!.readFile('/tmp/entrypoint-ran')).toString()).toBe('original\n');
    // the agent rewrites the entrypoint: in a grader it would run as the image's user before the tests
    await episode.step({
      type: 'exec',
      command: `printf '#!/bin/sh\\necho agent > /tmp/entrypoint-ran\\nexec "$@"\\n' > /opt/start.sh && chmod 755 /opt/start.sh`,
    });
    // it would run, were a grader to start the entrypoint over the agent's diff
    const rewritten = await episode.sandbox!.exec([
      'sh',
      '-c',
      '/opt/start.sh true && cat /tmp/entrypoint-ran',
    ]);
    expect(rewritten.stdout).toBe('agent\n');
    // the mark goes, so only an entrypoint run in the grader could make it again
    await episode.step({ type: 'exec', command: 'rm -f /tmp/entrypoint-ran' });
    const { reward, info } = await episode.step({ type: 'submit' });
    expect(info.grade?.details['reason']).toMatch(/wrote reward\.txt 0/);
    expect(reward).toBe(0);
  });

  it('runs nothing of an image without an ENTRYPOINT, not even its CMD', async () => {
    const dir = await taskDir('cmd-only', {
      'environment/Dockerfile': debianDockerfile(
        'WORKDIR /app',
        'CMD ["sh", "-c", "touch /tmp/cmd-ran; sleep 1000"]',
      ),
    });
    const episode = taskEnv(await loadHarborTask(dir));
    await episode.reset();
    const box = episode.sandbox!;
    expect((await box.exec(['test', '-e', '/tmp/cmd-ran'])).exitCode).toBe(1);
    expect((await box.exec(LIST_PROCESSES)).stdout).toBe('');
  });

  describe('healthcheck', () => {
    const check = (over: Partial<TaskHealthcheck>): TaskHealthcheck => ({
      command: 'true',
      intervalMs: 50,
      timeoutMs: 10_000,
      startPeriodMs: 0,
      startIntervalMs: 50,
      retries: 3,
      ...over,
    });
    /** A probe that counts its runs in /tmp/probes and passes from the `n`th on. */
    const passesFrom = (n: number) =>
      `n=$(( $(cat /tmp/probes 2>/dev/null || echo 0) + 1 )); echo $n > /tmp/probes; echo "probe $n not ready"; [ $n -ge ${n} ]`;
    const probesRun = async (box: Sandbox) => Number((await box.readFile('/tmp/probes')).toString());

    it('passes at the first probe that passes', async () => {
      const box = await sandbox();
      expect(await waitHealthy('t', box, check({ command: passesFrom(1) }))).toEqual({ probes: 1 });
      expect(await probesRun(box)).toBe(1);
    });

    it('waits out a slow start: failures in the start period do not count', async () => {
      const box = await sandbox();
      // retries 1: the third probe would never run if the start period's failures counted
      const slow = check({ command: passesFrom(3), retries: 1, startPeriodMs: 600_000, intervalMs: 600_000 });
      expect(await waitHealthy('t', box, slow)).toEqual({ probes: 3 });
      expect(await probesRun(box)).toBe(3);
    });

    it('fails after `retries` failures in a row, naming the command, the counts and the output', async () => {
      const box = await sandbox();
      const failing = check({ command: passesFrom(1_000_000), retries: 2, startPeriodMs: 200 });
      const error = await waitHealthy('slow-db', box, failing).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(error?.message).toMatch(/^Task slow-db: its healthcheck `n=\$/);
      const counts =
        /failed 2 times in a row after its start period of 200 ms \((\d+) probes in all, (\d+) failed during the start period\); the last exit 1, printing:\nprobe (\d+) not ready$/.exec(
          error?.message ?? '',
        );
      expect(counts).not.toBeNull();
      const [, all, starting, last] = counts!.map(Number);
      // every probe ran once, and exactly the two after the start period counted
      expect(all).toBe(await probesRun(box));
      expect(last).toBe(all);
      expect(all).toBe(starting! + 2);
    });

    it('kills a probe at its timeout, and counts it as failed', async () => {
      const box = await sandbox();
      const hung = check({ command: 'echo started; exec sleep 1000', timeoutMs: 300, retries: 1 });
      await expect(waitHealthy('t', box, hung)).rejects.toThrow(
        /failed 1 times in a row .* the last timed out after 300 ms/,
      );
      expect((await box.exec(LIST_PROCESSES)).stdout).not.toContain('sleep');
    });

    it("fails a task's start with a task error, before the agent runs", async () => {
      const task: Task = {
        ...(await loadHarborTask(HELLO)),
        environment: { kind: 'stored', ref: 'debian:bookworm' },
        healthcheck: check({ command: 'echo "db is down" >&2; exit 3', retries: 2 }),
      };
      await expect(taskEnv(task).reset()).rejects.toThrow(
        /Task hello-file: its healthcheck `echo "db is down" >&2; exit 3` failed 2 times in a row .*exit 3, printing:\ndb is down$/,
      );
    });

    it('gates a task whose service starts slowly: sandgym check passes it', async () => {
      const task: Task = {
        ...(await loadHarborTask(join(FIXTURES, 'checked', 'harbor-healthcheck'))),
        // as the fixture's task.toml says it (its loader reads it elsewhere)
        healthcheck: {
          command: `python3 -c 'import urllib.request; urllib.request.urlopen("http://localhost:8080/status", timeout=2)'`,
          intervalMs: 1000,
          timeoutMs: 5000,
          startPeriodMs: 60_000,
          startIntervalMs: 500,
          retries: 3,
        },
      };
      await TaskEnv.create(env.platform, task).prepare();
      const results = await checkTask(env.platform, task);
      expect(results.filter((r) => !r.passed)).toEqual([]);
    });
  });
});
