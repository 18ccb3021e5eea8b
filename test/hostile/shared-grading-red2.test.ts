import { appendFile, cp, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadTasks, type SandboxAction, type Task } from '../../src/env/index.ts';
import { checkTask } from '../../src/rollout/index.ts';
import {
  createTestPlatform,
  debianMirrorRules,
  playEpisode,
  type TestPlatform,
} from '../support/platform.ts';
import { attack } from './summary.ts';

const MONITOR_TASK = resolve('test/fixtures/tasks/checked/harbor-daemon-monitor');
const BEACON_TASK = resolve('test/fixtures/tasks/checked/tb-monitor-same-shell');

/** A line of the hidden monitor tests that no agent may ever read. */
const HIDDEN_LINE = 'heartbeat did not move';

/**
 * A pytest plugin the agent leaves in its workdir, announced by an entry point table beside it:
 * `python -m pytest` run from the workdir puts it on sys.path, and pytest loads every plugin its
 * distributions name before collection. It makes every test report a pass.
 */
const ENTRY_POINT_PLUGIN = [
  'mkdir -p /app/sg_helper-1.0.dist-info',
  'printf "Metadata-Version: 2.1\\nName: sg-helper\\nVersion: 1.0\\n" > /app/sg_helper-1.0.dist-info/METADATA',
  'printf "[pytest11]\\nsghelper = sghelper_plugin\\n" > /app/sg_helper-1.0.dist-info/entry_points.txt',
  'printf \'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n    outcome = yield\\n    report = outcome.get_result()\\n    report.outcome = "passed"\\n    report.longrepr = None\\n\' > /app/sghelper_plugin.py',
].join(' && ');

/**
 * A second attacker's pass over grading in the agent's own sandbox (docs/security.md, "Shared
 * grading"): each test asserts the safe outcome, so a failing one is a break. Titles that start
 * with BREAK: failed when written; those without it that a comment calls broken are closed now:
 * the plugins (start-up hooks removed from the live sandbox before the tests), the tests read by
 * another user's leftover (their folders private to the tests' user), the tests seen after
 * grading (a checkpoint refused, the graders' paths removed), the same-user warning, and the
 * loader's environment_mode.
 */
describe('grading in the agent sandbox, second attacker', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-shared-red2', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  /** A copy of a task folder whose Dockerfile also makes `worker` the owner of /app. */
  async function withWorker(source: string, name: string, dockerfile: string): Promise<string> {
    const dir = join(env.dataDir, 'tasks', name);
    await mkdir(dir, { recursive: true });
    await cp(source, dir, { recursive: true });
    await appendFile(join(dir, dockerfile), 'RUN useradd -m worker && chown worker /app\n');
    return dir;
  }

  /** The beacon task (Terminal-Bench, `python3 -m pytest` from /app), its agent as `user`. */
  async function beaconTask(user: 'worker' | 'root'): Promise<Task> {
    const dir = await withWorker(BEACON_TASK, `beacon-${user}`, 'Dockerfile');
    const [task] = await loadTasks([dir]);
    expect(task?.verifierMode).toBe('shared');
    return { ...task!, agentUser: user };
  }

  /** The monitor task (Harbor), graded in place, its agent as `worker`, its tests as root. */
  async function monitorAsWorker(): Promise<Task> {
    const dir = await withWorker(MONITOR_TASK, 'monitor-worker', join('environment', 'Dockerfile'));
    await writeFile(
      join(dir, 'task.toml'),
      'version = "1.1"\n[verifier]\ntimeout_sec = 60\nenvironment_mode = "shared"\n[agent]\nuser = "worker"\n[environment]\nnetwork_mode = "no-network"\n',
    );
    const [task] = await loadTasks([dir]);
    expect(task?.agentUser).toBe('worker');
    expect(task?.verifierMode).toBe('shared');
    return task!;
  }

  for (const user of ['worker', 'root'] as const) {
    it(`scores a pytest plugin left in the workdir by a ${user} agent 0, or names it`, () =>
      attack('shared-grading', `an entry point plugin in the workdir (${user} agent)`, async () => {
        const task = await beaconTask(user);
        const actions: SandboxAction[] = [{ type: 'exec', command: ENTRY_POINT_PLUGIN }];
        const report = await playEpisode(env.platform, task, actions);
        expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
        // safe: no reward for a beacon that was never started, or at least the plugin named
        const named = JSON.stringify(report.details ?? {}).includes('sghelper');
        expect(report.reward === 0 || named, JSON.stringify(report.details)).toBe(true);
      }));
  }

  // Used to break: a diff larger than the disk by apparent size (a sparse file) cannot be packed,
  // and grading in place then went on without the diff's start-up hooks removed
  it('scores a plugin hidden behind a diff too large to pack 0 when graded in place', () =>
    attack('shared-grading', 'an entry point plugin beside a sparse file over the disk cap', async () => {
      const plant = `${ENTRY_POINT_PLUGIN} && truncate -s 64G /app/.sparse`;
      const report = await playEpisode(env.platform, await beaconTask('worker'), [
        { type: 'exec', command: plant },
      ]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(report.reward, JSON.stringify(report.details)).toBe(0);
    }));

  // Used to break: a report lists at most 10,000 pattern-excluded paths, and grading in place
  // removed only the start-up hooks listed, so hooks past a flood of harmless ones stayed
  it('scores a plugin hidden behind 10,000 other start-up hooks 0 when graded in place', () =>
    attack('shared-grading', 'an entry point plugin behind a flood of .pth files', async () => {
      const flood = "python3 -c \"for i in range(10001): open(f'/app/f{i}.pth', 'w').close()\"";
      const report = await playEpisode(env.platform, await beaconTask('worker'), [
        { type: 'exec', command: `${ENTRY_POINT_PLUGIN} && ${flood}` },
      ]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(report.reward, JSON.stringify(report.details)).toBe(0);
    }));

  /** Copies the hidden tests, while they run, into a file of the agent's: a leftover process's loop. */
  const THIEF =
    'nohup setsid sh -c "while :; do cat /tests/test.sh >> /tmp/stolen 2>/dev/null; sleep 0.05; done" >/dev/null 2>&1 </dev/null &';

  it('keeps a plugin left in the workdir out of a fresh grader (the twin of the break above)', () =>
    attack('shared-grading', 'an entry point plugin in the workdir, graded fresh', async () => {
      const task = { ...(await beaconTask('worker')), verifierMode: 'fresh' as const };
      const report = await playEpisode(env.platform, task, [{ type: 'exec', command: ENTRY_POINT_PLUGIN }]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(report.reward, JSON.stringify(report.details)).toBe(0);
    }));

  it("names a root agent's pytest plugin in site-packages as tampering, or scores it 0", () =>
    attack('shared-grading', 'an entry point plugin in site-packages (root agent)', async () => {
      const site = '/usr/local/lib/python3.11/dist-packages';
      const plant = `mkdir -p ${site} && ${ENTRY_POINT_PLUGIN} && mv /app/sg_helper-1.0.dist-info /app/sghelper_plugin.py ${site}/`;
      const report = await playEpisode(env.platform, await beaconTask('root'), [
        { type: 'exec', command: plant },
      ]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      // the residual docs/security.md admits: a replaced tool is at least reported
      expect(report.reward === 0 || report.tampered.length > 0, JSON.stringify(report)).toBe(true);
    }));

  // Used to break: the host's fs.protected_symlinks (and fifos, regular) were 0, so root followed
  // the agent's link; sandgym setup now sets them (link-protections.ts).
  it('never lets the root tests follow a link the agent user left in /tmp', async () => {
    await using task = TaskEnv.create(env.platform, await monitorAsWorker());
    await task.reset();
    await task.step({ type: 'exec', command: 'ln -s /etc/motd /tmp/grading.log' });
    // a test script's scratch file, written as root (the tests' user) in the agent's sandbox
    await task.sandbox!.exec(['sh', '-c', 'echo written-by-the-tests > /tmp/grading.log']);
    const motd = await task.sandbox!.exec(['cat', '/etc/motd']);
    expect(motd.stdout).not.toContain('written-by-the-tests');
  });

  it("keeps the hidden tests from a non-root agent's leftover process while they run", () =>
    attack('shared-grading', 'a leftover process of a non-root agent reading /tests', async () => {
      await using task = TaskEnv.create(env.platform, await monitorAsWorker());
      await task.reset();
      await task.step({ type: 'exec', command: THIEF });
      const grade = await task.grade();
      expect(grade.reward).toBe(0);
      expect(grade.details['gradedIn']).toBe('the agent sandbox');
      // the platform's own look (root) at what the agent's process took
      const stolen = await task.sandbox!.exec(['sh', '-c', 'cat /tmp/stolen']);
      expect(stolen.stdout).not.toContain(HIDDEN_LINE);
    }));

  for (const depth of ['memory', 'disk'] as const) {
    it(`never shows the hidden tests to a step after a ${depth} checkpoint of the graded sandbox`, () =>
      attack('shared-grading', `a ${depth} checkpoint taken after grading in place, restored`, async () => {
        await using task = TaskEnv.create(env.platform, await monitorAsWorker());
        await task.reset();
        await task.step({ type: 'exec', command: THIEF });
        const grade = await task.grade();
        expect(grade.details['gradedIn']).toBe('the agent sandbox');
        // safe: the checkpoint is refused, or what it restores holds no tests
        const checkpoint = await task.checkpoint({ depth }).catch((error: unknown) => error);
        if (checkpoint instanceof Error) return;
        await task.restore(checkpoint as Awaited<ReturnType<TaskEnv['checkpoint']>>);
        const step = await task.step({
          type: 'exec',
          command: 'cat /tests/test.sh /logs/verifier/reward.txt /tmp/stolen',
        });
        expect(JSON.stringify(step.observation)).not.toContain(HIDDEN_LINE);
      }));
  }

  it('never shows the hidden tests to a step after restoring a checkpoint taken before grading', () =>
    attack(
      'shared-grading',
      'a memory checkpoint taken before grading in place, restored after',
      async () => {
        await using task = TaskEnv.create(env.platform, await monitorAsWorker());
        await task.reset();
        // what a tree search does: save, let this branch be graded, go back to try another (the
        // thief starts after the checkpoint: CRIU cannot dump a process of another user's)
        const checkpoint = await task.checkpoint();
        await task.step({ type: 'exec', command: THIEF });
        const grade = await task.grade();
        expect(grade.details['gradedIn']).toBe('the agent sandbox');
        await task.restore(checkpoint);
        const step = await task.step({
          type: 'exec',
          command: 'sleep 1; cat /tests/test.sh /logs/verifier/reward.txt /tmp/stolen',
        });
        expect(JSON.stringify(step.observation)).not.toContain(HIDDEN_LINE);
      },
    ));

  // Used to break: CRIU, without CAP_SYS_RESOURCE on this host, cannot read the rlimits of a
  // process of another user, and the checkpoint failed `platform_error`; now it is `unsupported`
  // at memory depth (naming the capability) and TaskEnv falls back to a disk checkpoint.
  it('checkpoints an episode whose non-root agent left a process running', () =>
    attack('shared-grading', "a non-root agent's leftover process against checkpoint()", async () => {
      await using task = TaskEnv.create(env.platform, await monitorAsWorker());
      await task.reset();
      // the honest work of this very task: a monitor left running, as the agent user
      await task.step({
        type: 'exec',
        command:
          'nohup setsid sh -c "while :; do date +%s%N > /app/heartbeat; sleep 0.5; done" >/dev/null 2>&1 </dev/null &',
      });
      // safe: a checkpoint of some depth, never a platform failure the agent chose
      const checkpoint = await task.checkpoint().catch((error: unknown) => error);
      expect(checkpoint instanceof Error ? checkpoint.message : 'made').toBe('made');
    }));

  it('never shows the hidden tests to an env that takes over the graded sandbox', () =>
    attack('shared-grading', 'TaskEnv.attach to a sandbox graded in place', async () => {
      const loaded = await monitorAsWorker();
      await using first = TaskEnv.create(env.platform, loaded);
      await first.reset();
      await first.grade();
      // an eval killed after grading, resumed by a new env over the sandbox it left
      await using resumed = TaskEnv.create(env.platform, loaded);
      const taken = await resumed
        .attach(first.sandbox!, 'resumed-after-grading', 60_000)
        .catch((error: unknown) => error);
      if (taken instanceof Error) return;
      // safe: the step is refused, or it finds no tests
      const seen = await resumed.step({ type: 'exec', command: 'cat /tests/test.sh' }).then(
        (step) => JSON.stringify(step.observation),
        (error: unknown) => String(error),
      );
      expect(seen).not.toContain(HIDDEN_LINE);
    }));

  /** What a non-root agent leaves behind to starve its own sandbox while the tests run there. */
  const starvers: Record<string, { command: string; diskMib?: number }> = {
    'its disk filled': {
      command: 'head -c 200M /dev/zero > /app/fill 2>/dev/null; df -m /app; true',
      diskMib: 64,
    },
    'its process table filled': {
      command:
        'nohup setsid sh -c "while :; do sleep 1000 & done" >/dev/null 2>&1 </dev/null & sleep 3; ls /proc | grep -c "^[0-9]"',
    },
    'its memory held': {
      command:
        "nohup setsid python3 -c 'import time; b = bytearray(470 << 20); time.sleep(1000)' >/dev/null 2>&1 </dev/null & sleep 3",
    },
  };
  for (const [name, { command, diskMib }] of Object.entries(starvers))
    for (const mode of ['shared', 'fresh'] as const) {
      // Used to break (its disk filled): the btrfs snapshot packDiff prunes inherited the agent's
      // full quota, so the platform's own first write failed and the episode was verifier_error.
      it(`scores a non-root agent that left ${name} 0 (graded ${mode}), never masked`, () =>
        attack('shared-grading', `a non-root agent's sandbox with ${name} (${mode})`, async () => {
          const task = { ...(await monitorAsWorker()), verifierMode: mode };
          const starved = diskMib ? { ...task, resources: { ...task.resources, diskMib } } : task;
          const report = await playEpisode(env.platform, starved, [{ type: 'exec', command }]);
          // safe: the agent's own doing is scored, not blamed on the task or the platform
          expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
          expect(report.reward, JSON.stringify(report.details)).toBe(0);
        }));
    }

  it('scores a non-root agent whose leftover fills the disk once grading starts 0, never masked', () =>
    attack(
      'shared-grading',
      "a non-root agent's leftover filling the disk while the tests are staged",
      async () => {
        const task = await monitorAsWorker();
        const filler =
          "nohup setsid sh -c 'while [ ! -e /tests ]; do :; done; head -c 200M /dev/zero > /app/fill' >/dev/null 2>&1 </dev/null &";
        const starved = { ...task, resources: { ...task.resources, diskMib: 64 } };
        const report = await playEpisode(env.platform, starved, [{ type: 'exec', command: filler }]);
        expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
        expect(report.reward, JSON.stringify(report.details)).toBe(0);
      },
    ));

  /** Renames a reward of 1 into place as fast as it can, forever: never an empty file to read. */
  const RACER =
    'nohup setsid sh -c "while :; do echo 1 > /logs/verifier/.r 2>/dev/null && mv -f /logs/verifier/.r /logs/verifier/reward.txt 2>/dev/null; done" >/dev/null 2>&1 </dev/null &';

  // docs/security.md once said "With `[agent] user`, the classes above are closed", and a racer of
  // an agent user who is the tests' user too scored 1. Nothing in one sandbox can keep one user
  // from itself: the residual is now the docs' own, and every such grade names it.
  it("names the residual in the grade of an agent that is the tests' user too", () =>
    attack('shared-grading', "a racing process of an [agent] user who is also the tests' user", async () => {
      const task = { ...(await monitorAsWorker()), verifierUser: 'worker' };
      const report = await playEpisode(env.platform, task, [{ type: 'exec', command: RACER }]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(String(report.details?.['residual']), JSON.stringify(report.details)).toMatch(
        /the agent ran as the tests' user \(worker\)/,
      );
    }));

  it('warns of a task whose agent and tests run as the same non-root user', async () => {
    const task = { ...(await monitorAsWorker()), verifierUser: 'worker' };
    const results = await checkTask(env.platform, task);
    const fits = results.find((r) => r.name === 'grading fits what the agent leaves running');
    expect(fits?.passed, JSON.stringify(fits)).toBe(true);
    expect(fits?.detail).toMatch(/can reach the tests/);
  });

  it("loads a Harbor task's environment_mode", async () => {
    const [task] = await loadTasks([MONITOR_TASK]);
    expect(task?.verifierMode).toBe('shared');
  });

  /** Kills every process of the sandbox but its agent and itself, over and over. */
  const KILLER =
    "nohup setsid sh -c 'while :; do for d in /proc/[0-9]*; do p=${d#/proc/}; [ $p = 1 ] || [ $p = $$ ] || kill -9 $p 2>/dev/null; done; done' >/dev/null 2>&1 </dev/null &";

  it('scores a root agent whose leftover kills every grading process 0, never masked', () =>
    attack('shared-grading', "a root agent's leftover killing the verifier's processes", async () => {
      const [loaded] = await loadTasks([MONITOR_TASK]);
      const task = { ...loaded!, verifierMode: 'shared' as const };
      const report = await playEpisode(env.platform, task, [{ type: 'exec', command: KILLER }]);
      expect(report.outcome, JSON.stringify(report)).toEqual({ kind: 'ok' });
      expect(report.reward, JSON.stringify(report.details)).toBe(0);
    }));
});

/**
 * The verifier's network, which a task may make wider than its agent's (a test script that
 * downloads its runner): graded in place, the agent's leftover processes are still there.
 */
describe("the verifier's network, graded in the agent sandbox", () => {
  let env: TestPlatform;
  let mirror: string;

  beforeAll(async () => {
    const rules = await debianMirrorRules();
    mirror = rules['mirror:debian']![0]!;
    env = await createTestPlatform('hostile-shared-red2-net', {
      privateStore: true,
      seed: ['debian:bookworm'],
      networkRules: rules,
    });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  // broke when written: grading in place gave the agent's leftovers the verify stage's network.
  // Such a task is now refused before it runs; its fresh twin still gets its tests' network.
  it("keeps the verifier's network from an agent stage without one", () =>
    attack('shared-grading', "the verify stage's network reached by the agent's leftover", async () => {
      const [loaded] = await loadTasks([MONITOR_TASK]);
      const task: Task = {
        ...loaded!,
        verifierMode: 'shared',
        network: { setup: [], agent: [], verify: ['mirror:debian'] },
      };
      const [host, port] = mirror.split(':');
      const probe = `timeout 2 bash -c "exec 3<>/dev/tcp/${host}/${port}" 2>/dev/null`;
      await using refused = TaskEnv.create(env.platform, task);
      await expect(refused.reset()).rejects.toThrow(
        /tests' network reaches what its agent's does not \(mirror:debian\)/,
      );
      // the honest twin: graded fresh, the tests reach the mirror and the agent's stage still cannot
      await using run = TaskEnv.create(env.platform, { ...task, verifierMode: 'fresh' });
      await run.reset();
      // the agent's own stage has no network: the probe fails, and the process stays to wait
      const now = await run.step({ type: 'exec', command: `${probe} && echo reached || echo blocked` });
      expect(JSON.stringify(now.observation)).toContain('blocked');
      await run.step({
        type: 'exec',
        command: `nohup setsid bash -c 'while :; do ${probe} && echo reached >> /tmp/net; sleep 0.2; done' >/dev/null 2>&1 </dev/null &`,
      });
      await run.grade();
      const net = await run.sandbox!.exec(['sh', '-c', 'cat /tmp/net 2>/dev/null; true']);
      expect(net.stdout).not.toContain('reached');
    }));
});
