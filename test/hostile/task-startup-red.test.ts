import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadHarborTask, type Task } from '../../src/env/index.ts';
import { debianDockerfile, helloTaskWith } from '../support/task-dirs.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

/** A secret in the test process's environment, as a user's API key is in theirs. */
const SECRET = 'sk-redtask-4c1d9e-secret';
const SECRET_NAME = 'REDTASK_OPENAI_API_KEY';
const SECRET_HASH = createHash('sha256').update(SECRET).digest('hex');

/** Tests that pay out only while the mark of the task's own entrypoint (never the agent's) stands. */
const ENTRYPOINT_TESTS = [
  '#!/bin/bash',
  'if [ "$(cat /tmp/entrypoint-ran 2>/dev/null)" = original ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt',
  '',
].join('\n');

/**
 * Second attacker on the task start-up surface: host variables through task.toml templates,
 * ENTRYPOINTs the agent rewrites by a way the grader's exclusions do not name, and a task
 * author's entrypoint that outlives its sandbox. Each asserts the safe outcome.
 */
describe('task start-up under a second attacker', () => {
  let env: TestPlatform;
  const opened: TaskEnv[] = [];

  beforeAll(async () => {
    process.env[SECRET_NAME] = SECRET;
    env = await createTestPlatform('hostile-task-startup-red', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
  });

  afterEach(async () => {
    for (const thing of opened.splice(0)) await thing.close();
  });

  afterAll(async () => {
    delete process.env[SECRET_NAME];
    await env?.[Symbol.asyncDispose]();
  });

  const taskEnv = (task: Task): TaskEnv => {
    const made = TaskEnv.create(env.platform, task);
    opened.push(made);
    return made;
  };

  const taskDir = (name: string, files: Record<string, string>): Promise<string> =>
    helloTaskWith(env.dataDir, name, files);

  describe('host variables through templates (task author)', () => {
    it('never puts a host variable the user did not allow into a sandbox', () =>
      attack('task-env', 'templates of every shape', async () => {
        const toml = [
          'version = "1.0"',
          '[verifier]',
          'timeout_sec = 60',
          '[verifier.env]',
          `V1 = "\${${SECRET_NAME}:-\${${SECRET_NAME}}}"`,
          `V2 = "$${SECRET_NAME}"`,
          '[agent]',
          'timeout_sec = 120',
          '[environment]',
          'cpus = 1',
          'memory_mb = 512',
          '[environment.env]',
          `E1 = "\${${SECRET_NAME}:-fallback}"`,
          `E2 = "$${SECRET_NAME}"`,
          `E3 = "$\${${SECRET_NAME}}"`,
          `E4 = " \${${SECRET_NAME}}"`,
          `E5 = "\${${SECRET_NAME}:-\${HOME}}"`,
          '',
        ].join('\n');
        const dir = await taskDir('env-leak', {
          'task.toml': toml,
          'environment/Dockerfile': debianDockerfile(
            'COPY start.sh /opt/start.sh',
            'WORKDIR /app',
            'ENTRYPOINT ["/opt/start.sh"]',
          ),
          'environment/start.sh': '#!/bin/sh\nenv > /tmp/entrypoint-env\nexec "$@"\n',
          // the grader pays out when the secret reached it: the safe outcome is 0
          // (by its hash: the secret itself written into a task file would be on the node's disk)
          'tests/test.sh': `#!/bin/bash\nfor f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null; done | while IFS= read -r line; do printf %s "\${line#*=}" | sha256sum; done | grep -q ${SECRET_HASH} && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n`,
        });
        const task = await loadHarborTask(dir);
        expect(JSON.stringify(task)).not.toContain(SECRET);
        const episode = taskEnv(task);
        const reset = await episode.reset();
        expect(JSON.stringify(reset)).not.toContain(SECRET);
        const box = episode.sandbox!;
        const seen = await box.exec([
          'sh',
          '-c',
          'cat /tmp/entrypoint-env; env; for f in /proc/[0-9]*/environ; do tr "\\0" "\\n" < $f; done; true',
        ]);
        expect(seen.stdout).not.toContain(SECRET);
        const { reward, info } = await episode.step({ type: 'submit' });
        expect(JSON.stringify(info)).not.toContain(SECRET);
        expect(reward, JSON.stringify(info.grade?.details)).toBe(0);
      }));

    it('keeps a secret the user allowed for the tests out of the agent and the logs on disk', () =>
      attack('task-env', 'allowed verifier secret on disk', async () => {
        const dir = await taskDir('env-allowed', {
          'task.toml': [
            'version = "1.0"',
            '[verifier]',
            'timeout_sec = 60',
            '[verifier.env]',
            `TOKEN = "\${${SECRET_NAME}}"`,
            '[agent]',
            'timeout_sec = 120',
            '[environment]',
            'cpus = 1',
            'memory_mb = 512',
            '',
          ].join('\n'),
          // the tests use the token as the user meant them to: they pay out when they have it
          'tests/test.sh': `#!/bin/bash\nif [ "$(printf %s "$TOKEN" | sha256sum | cut -c1-64)" = ${SECRET_HASH} ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n`,
        });
        const episode = taskEnv(await loadHarborTask(dir, { taskEnv: [SECRET_NAME] }));
        await episode.reset();
        const seen = await episode.sandbox!.exec(['sh', '-c', 'env; cat /proc/[0-9]*/environ; true']);
        expect(seen.stdout).not.toContain(SECRET);
        const { reward, info } = await episode.step({ type: 'submit' });
        expect(reward, JSON.stringify(info.grade?.details)).toBe(1);
        expect(JSON.stringify(info)).not.toContain(SECRET);
        await episode.close();
        // trajectory logs, reports, anything the platform kept of the run
        const onDisk = (() => {
          try {
            return execFileSync('grep', ['-rl', '--', SECRET, env.dataDir]).toString().trim();
          } catch {
            return '';
          }
        })();
        expect(onDisk).toBe('');
      }));

    it("never echoes the host variable's value in the error that refuses it", () =>
      attack('task-env', 'error message echo', async () => {
        const dir = await taskDir('env-error', {
          'task.toml': [
            'version = "1.0"',
            '[environment]',
            '[environment.env]',
            `E1 = "\${${SECRET_NAME}}"`,
            '',
          ].join('\n'),
        });
        const error = await loadHarborTask(dir).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(String(error)).toMatch(/not allowed to read/);
        expect(String(error)).not.toContain(SECRET);
      }));
  });

  describe("the grader's entrypoint, rewritten by the agent", () => {
    /**
     * Plays one episode: the agent runs `rewrite`, then submits. Safe: no grader ran the agent's
     * version (it would write `agent`); the task's own ran once, at the agent's start, and its
     * mark reaches the grader in the agent's diff (reward 1). Fresh graders run no entrypoint
     * since these broke: see docs/tasks.md, "How a task's sandbox starts".
     */
    async function rewriteAndGrade(files: Record<string, string>, rewrite: string): Promise<void> {
      const dir = await taskDir('entrypoint-red', { ...files, 'tests/test.sh': ENTRYPOINT_TESTS });
      const episode = taskEnv(await loadHarborTask(dir));
      await episode.reset();
      expect((await episode.sandbox!.readFile('/tmp/entrypoint-ran')).toString()).toBe('original\n');
      const done = await episode.step({ type: 'exec', command: rewrite });
      expect(done.observation).toBeDefined();
      const { reward, info } = await episode.step({ type: 'submit' });
      expect(reward, JSON.stringify(info.grade?.details)).toBe(1);
    }

    it("never runs the agent's rewrite of an ENTRYPOINT found on PATH in a grader", () =>
      attack('entrypoint', 'entrypoint named by PATH', () =>
        rewriteAndGrade(
          {
            'environment/Dockerfile': debianDockerfile(
              'COPY start.sh /usr/local/bin/start.sh',
              'WORKDIR /app',
              'ENTRYPOINT ["start.sh"]',
            ),
            'environment/start.sh': '#!/bin/sh\necho original > /tmp/entrypoint-ran\nexec "$@"\n',
          },
          `printf '#!/bin/sh\\necho agent > /tmp/entrypoint-ran\\nexec "$@"\\n' > /usr/local/bin/start.sh`,
        ),
      ));

    it('never runs a script named inside an `sh -c` ENTRYPOINT as the agent rewrote it', () =>
      attack('entrypoint', 'entrypoint inside sh -c', () =>
        rewriteAndGrade(
          {
            'environment/Dockerfile': debianDockerfile(
              'COPY start.sh /opt/start.sh',
              'WORKDIR /app',
              'ENTRYPOINT ["sh", "-c", "exec /opt/start.sh \\"$@\\"", "--"]',
            ),
            'environment/start.sh': '#!/bin/sh\necho original > /tmp/entrypoint-ran\nexec "$@"\n',
          },
          `printf '#!/bin/sh\\necho agent > /tmp/entrypoint-ran\\nexec "$@"\\n' > /opt/start.sh`,
        ),
      ));

    it('never runs the config file the task entrypoint sources as the agent rewrote it', () =>
      attack('entrypoint', 'entrypoint sources a config file', () =>
        rewriteAndGrade(
          {
            'environment/Dockerfile': debianDockerfile(
              'COPY start.sh /opt/start.sh',
              'COPY app.conf /etc/default/app',
              'WORKDIR /app',
              'ENTRYPOINT ["/opt/start.sh"]',
            ),
            'environment/app.conf': 'MARK=original\n',
            'environment/start.sh':
              '#!/bin/sh\n. /etc/default/app\necho "$MARK" > /tmp/entrypoint-ran\nexec "$@"\n',
          },
          // what a config file sourced by a root shell can do: anything, before and during the tests
          `printf 'MARK=agent\\n' > /etc/default/app`,
        ),
      ));
  });

  describe("the grader's start-up, rewritten by the agent to forge the reward", () => {
    /**
     * Run as root in the grader before the tests: puts a `cat` in place that says what the tests
     * look for. The diff never carries a PATH tool (grading-scope.ts); a start-up hook writes it.
     */
    const SWAP_CAT = "printf '#!/bin/sh\\necho hello sandgym\\n' > /usr/bin/cat\n";

    /** The hello-file task (tests pay out for /app/hello.txt), with start-up files of its own. */
    async function forgeAndGrade(
      files: Record<string, string>,
      path: string,
      content: string,
    ): Promise<void> {
      const dir = await taskDir('forge-red', files);
      const episode = taskEnv(await loadHarborTask(dir));
      await episode.reset();
      // the agent never writes /app/hello.txt: it only rewrites a start-up hook of the grader's
      await episode.step({ type: 'write_file', path, content });
      await episode.step({ type: 'exec', command: `chmod 755 ${path}` });
      const { reward, info } = await episode.step({ type: 'submit' });
      expect(reward, JSON.stringify(info.grade?.details)).toBe(0);
    }

    it("keeps the tests' tools from a config file the task entrypoint sources", () =>
      attack('entrypoint', 'tool swap through a sourced config file', () =>
        forgeAndGrade(
          {
            'environment/Dockerfile': debianDockerfile(
              'COPY start.sh /opt/start.sh',
              'COPY app.conf /etc/default/app',
              'WORKDIR /app',
              'ENTRYPOINT ["/opt/start.sh"]',
            ),
            'environment/app.conf': 'PORT=8080\n',
            'environment/start.sh': '#!/bin/sh\n. /etc/default/app\nexec "$@"\n',
          },
          '/etc/default/app',
          `PORT=8080\n${SWAP_CAT}`,
        ),
      ));

    it("keeps the tests' tools from the workdir's ENTRYPOINT script", () =>
      attack('entrypoint', 'tool swap through a workdir entrypoint', () =>
        forgeAndGrade(
          {
            'environment/Dockerfile': debianDockerfile(
              'WORKDIR /app',
              'COPY start.sh /app/start.sh',
              'ENTRYPOINT ["./start.sh"]',
            ),
            'environment/start.sh': '#!/bin/sh\nexec "$@"\n',
          },
          // the tests never run the agent's code: only the grader's start does
          '/app/start.sh',
          `#!/bin/sh\n${SWAP_CAT}exec "$@"\n`,
        ),
      ));

    it("keeps the tests' tools from a script the healthcheck runs", () =>
      attack('healthcheck', 'tool swap through the healthcheck script', () =>
        forgeAndGrade(
          {
            'task.toml': [
              'version = "1.0"',
              '[verifier]',
              'timeout_sec = 60',
              '[agent]',
              'timeout_sec = 120',
              '[environment]',
              'cpus = 1',
              'memory_mb = 512',
              '[environment.healthcheck]',
              'command = "/opt/health.sh"',
              'interval_sec = 1',
              'start_interval_sec = 0.2',
              '',
            ].join('\n'),
            'environment/Dockerfile': debianDockerfile('COPY health.sh /opt/health.sh', 'WORKDIR /app'),
            'environment/health.sh': '#!/bin/sh\nexit 0\n',
          },
          '/opt/health.sh',
          `#!/bin/sh\n${SWAP_CAT}exit 0\n`,
        ),
      ));
  });

  describe('the grader, made to look broken by the agent', () => {
    it("scores 0, never the task's fault, a grader whose healthcheck the agent's diff fails", () =>
      attack('healthcheck', 'mask a 0 as a failed healthcheck', async () => {
        const dir = await taskDir('health-mask', {
          'task.toml': [
            'version = "1.0"',
            '[verifier]',
            'timeout_sec = 60',
            '[agent]',
            'timeout_sec = 120',
            '[environment]',
            'cpus = 1',
            'memory_mb = 512',
            '[environment.healthcheck]',
            'command = "test -f /app/ready"',
            'interval_sec = 0.2',
            'start_interval_sec = 0.2',
            'retries = 2',
            '',
          ].join('\n'),
          'environment/Dockerfile': ['FROM debian:bookworm', 'WORKDIR /app', 'RUN touch /app/ready', ''].join(
            '\n',
          ),
        });
        const episode = taskEnv(await loadHarborTask(dir));
        await episode.reset();
        // no work, and the grader's healthcheck made to fail: a 0 dressed as the task's fault
        await episode.step({ type: 'exec', command: 'rm /app/ready' });
        const { reward, info } = await episode.step({ type: 'submit' });
        expect(reward).toBe(0);
        // a fresh grader runs no healthcheck: graded as it stands, never blamed on the task
        expect(info.grade?.details['reason'], JSON.stringify(info)).toMatch(/wrote reward\.txt 0/);
      }));
  });

  describe("a task author's entrypoint", () => {
    it('ends a daemon that left its session with the sandbox', () =>
      attack('entrypoint', 'daemonized entrypoint outlives teardown', async () => {
        // a process name of at most 15 characters: what /proc/PID/comm and `pgrep -x` see
        const marker = `rtd${Math.random().toString(36).slice(2, 10)}`;
        const dir = await taskDir('entrypoint-daemon', {
          'environment/Dockerfile': debianDockerfile(
            'COPY start.sh /opt/start.sh',
            'WORKDIR /app',
            'ENTRYPOINT ["/opt/start.sh"]',
          ),
          // double fork into a new session, the pid file and the terminal left behind
          'environment/start.sh': `#!/bin/sh\necho original > /tmp/entrypoint-ran\ncp /bin/sleep /tmp/${marker}\nsetsid sh -c '/tmp/${marker} 100000 </dev/null >/dev/null 2>&1 &' &\nexec "$@"\n`,
        });
        const episode = taskEnv(await loadHarborTask(dir));
        await episode.reset();
        const inside = await episode.sandbox!.exec([
          'sh',
          '-c',
          // the entrypoint runs in the background: wait for its daemon to be up
          `for i in $(seq 100); do cat /proc/[0-9]*/comm 2>/dev/null | grep -qx ${marker} && break; sleep 0.1; done; cat /proc/[0-9]*/comm 2>/dev/null | grep -cx ${marker}`,
        ]);
        expect(Number(inside.stdout.trim())).toBeGreaterThan(0);
        await episode.step({ type: 'submit' });
        await episode.close();
        const host = (() => {
          try {
            return execFileSync('pgrep', ['-x', marker]).toString().trim();
          } catch {
            return '';
          }
        })();
        expect(host).toBe('');
        expect(await env.platform.liveSandboxes()).toEqual([]);
      }));
  });
});
