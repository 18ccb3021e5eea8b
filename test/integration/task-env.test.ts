import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cp, mkdir, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  TaskEnv,
  loadHarborTask,
  PUBLIC_NETWORK,
  loadTasks,
  type SandboxAction,
  type Verifier,
} from '../../src/env/index.ts';
import {
  EvalJournal,
  checkTask,
  evaluate,
  nopAgent,
  oracleAgent,
  scriptedAgent,
  type Agent,
  type EpisodeReport,
} from '../../src/rollout/index.ts';
import { CHEATS } from '../../examples/agents/cheats.ts';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const EXAMPLES = resolve('examples/tasks');

describe('Harbor tasks, fresh-box grading and evaluation', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('tasks', { privateStore: true, seed: ['debian:bookworm'] });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function taskCopy(name: string, change: (dir: string) => Promise<void>): Promise<string> {
    const dir = join(env.dataDir, 'tasks', `${name}-${Math.random().toString(36).slice(2, 8)}`);
    await mkdir(dir, { recursive: true });
    await cp(join(EXAMPLES, 'hello-file'), dir, { recursive: true });
    await change(dir);
    return dir;
  }

  it('names the file and field of a malformed task', async () => {
    const badToml = await taskCopy('bad-toml', (d) =>
      writeFile(join(d, 'task.toml'), '[verifier\ntimeout_sec = 1'),
    );
    await expect(loadHarborTask(badToml)).rejects.toThrow(/task\.toml is not valid TOML/);
    const badField = await taskCopy('bad-field', (d) =>
      writeFile(join(d, 'task.toml'), '[verifier]\ntimeout_sec = "soon"\n'),
    );
    await expect(loadHarborTask(badField)).rejects.toThrow(/task\.toml: verifier\.timeout_sec/);
    const noTests = await taskCopy('no-tests', (d) => rm(join(d, 'tests', 'test.sh')));
    await expect(loadHarborTask(noTests)).rejects.toThrow(/has no tests\/test\.sh: a Harbor task needs/);
  });

  it('resolves every example with the oracle and none with the do-nothing agent', async () => {
    const tasks = await loadTasks([EXAMPLES]);
    expect(tasks.map((t) => t.id)).toEqual([
      'calc__mean-1',
      'fix-sum',
      'hello-file',
      'oj-reverse-words',
      'oj-sum-pairs',
    ]);
    const oracle = await evaluate(env.platform, tasks, oracleAgent, { concurrency: 2 });
    expect(oracle.map((r) => [r.task, r.reward, r.outcome.kind])).toEqual([
      ['calc__mean-1', 1, 'ok'],
      ['fix-sum', 1, 'ok'],
      ['hello-file', 1, 'ok'],
      ['oj-reverse-words', 1, 'ok'],
      ['oj-sum-pairs', 1, 'ok'],
    ]);
    const nop = await evaluate(env.platform, tasks, nopAgent, { concurrency: 2 });
    expect(nop.map((r) => r.reward)).toEqual([0, 0, 0, 0, 0]);
  });

  it('keeps tests and solutions out of the agent sandbox and says how it mapped FROM', async () => {
    await using task = TaskEnv.create(env.platform, await loadHarborTask(join(EXAMPLES, 'hello-file')));
    const reset = await task.reset();
    expect(reset.info.notes).toEqual([
      "FROM debian:bookworm-slim: the store's debian:bookworm, the same Debian release",
    ]);
    const root = (await task.sandbox!.listDir('/')).map((e) => e.name);
    expect(root).not.toContain('tests');
    expect(root).not.toContain('solution');
    expect((await task.sandbox!.listDir('/logs')).map((e) => e.name)).toEqual(['agent', 'artifacts']);
  });

  it('keeps what a failed build noted in its error: the base it mapped FROM to', async () => {
    const dir = await taskCopy('failed-build', (d) =>
      writeFile(join(d, 'environment', 'Dockerfile'), 'FROM debian:bookworm-slim\nRUN exit 9\n'),
    );
    await using task = TaskEnv.create(env.platform, await loadHarborTask(dir));
    await expect(task.reset()).rejects.toThrow(
      /line 2: RUN failed with exit code 9.*build notes: FROM debian:bookworm-slim: the store's debian:bookworm/s,
    );
  });

  it('checkpoints an episode and restores it as a branch, protected paths and budget kept', async () => {
    await using task = TaskEnv.create(env.platform, await loadHarborTask(join(EXAMPLES, 'hello-file')));
    await task.reset();
    await task.step({ type: 'write_file', path: '/app/hello.txt', content: 'hello sandgym\n' });
    // a tamper attempt before the checkpoint: it must not ride along into the restored stack
    await task.step({ type: 'exec', command: 'echo forged > /usr/bin/forged-tool' });
    const checkpoint = await task.checkpoint();
    expect(checkpoint).toMatchObject({ depth: 'disk', stepIndex: 2, tampered: ['/usr/bin'] });
    expect(checkpoint.budgetLeftMs).toBeGreaterThan(0);
    // go on down a wrong branch, then come back
    await task.step({ type: 'exec', command: 'rm /app/hello.txt' });
    const restored = await task.restore(checkpoint);
    expect(restored.info.restoredFrom).toEqual(checkpoint);
    const sandbox = task.sandbox!;
    expect((await sandbox.readFile('/app/hello.txt')).toString()).toBe('hello sandgym\n');
    expect((await sandbox.exec(['sh', '-c', 'test -e /usr/bin/forged-tool; echo $?'])).stdout).toBe('1\n');
    const submitted = await task.step({ type: 'submit' });
    expect(submitted.reward).toBe(1);
    expect((submitted.info.grade as { tampered: string[] }).tampered).toEqual(['/usr/bin']);
  });

  it('gives a cheating agent no reward and raises its tamper signals', async () => {
    const cheats: SandboxAction[] = [
      { type: 'exec', command: 'mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt' },
      {
        type: 'exec',
        command:
          'mkdir -p /tests && printf "#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n" > /tests/test.sh',
      },
      { type: 'submit' },
    ];
    const cheater: Agent = (_o, { stepIndex }) => Promise.resolve(cheats[stepIndex] ?? { type: 'submit' });
    const [report] = await evaluate(
      env.platform,
      await loadTasks([join(EXAMPLES, 'hello-file')]),
      () => cheater,
      { concurrency: 1 },
    );
    expect(report?.reward).toBe(0);
    expect(report?.outcome).toEqual({ kind: 'ok' });
    expect(report?.tampered.sort()).toEqual(['/logs/verifier', '/tests']);
  });

  it('checks a sound task as sound and catches a task any agent passes', async () => {
    const sound = await checkTask(env.platform, await loadHarborTask(join(EXAMPLES, 'hello-file')));
    expect(sound.filter((r) => !r.passed)).toEqual([]);
    expect(sound.map((r) => r.name)).toHaveLength(7);
    const broken = await taskCopy('always-passes', (d) =>
      writeFile(join(d, 'tests', 'test.sh'), '#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n', {
        mode: 0o755,
      }),
    );
    const results = await checkTask(env.platform, await loadHarborTask(broken));
    expect(results.find((r) => r.name === 'do-nothing agent fails')).toMatchObject({
      passed: false,
      detail: expect.stringMatching(/the task is broken/) as unknown,
    });
  });

  it('tells empty hidden folders the Dockerfile made from hidden content the agent can see', async () => {
    const hiddenCheck = async (dockerfileLines: string): Promise<{ passed: boolean; detail: string }> => {
      const dir = await taskCopy('hidden-folders', (d) =>
        writeFile(
          join(d, 'environment', 'Dockerfile'),
          `FROM debian:bookworm-slim\nWORKDIR /app\n${dockerfileLines}`,
        ),
      );
      const results = await checkTask(env.platform, await loadHarborTask(dir));
      const hidden = results.find((r) => r.name === 'nothing hidden is visible to the agent');
      if (!hidden) throw new Error(`no hidden-files check among ${results.map((r) => r.name).join(', ')}`);
      return hidden;
    };
    // what Aider Polyglot and TermiGen Dockerfiles do: folders for the harness to fill later
    expect(await hiddenCheck('RUN mkdir -p /tests /solution\n')).toMatchObject({
      passed: true,
      detail: expect.stringMatching(/\/tests, \/solution: empty folders the image made/) as unknown,
    });
    expect(await hiddenCheck('RUN mkdir -p /tests && echo expected > /tests/expected.txt\n')).toMatchObject({
      passed: false,
      detail: expect.stringMatching(/the agent can see \/tests/) as unknown,
    });
    expect(await hiddenCheck('RUN ln -s /app /solution\n')).toMatchObject({ passed: false });
  });

  it('runs from the command line with the exit codes the README gives', () => {
    const cliEnv = { ...process.env, SANDGYM_DATA_DIR: env.dataDir, SANDGYM_STORE: env.platform.store.root };
    const out = join(env.dataDir, 'eval.json');
    const oracle = spawnSync(
      'node',
      [resolve('dist/src/cli/main.js'), 'eval', EXAMPLES, '--agent', 'oracle', '--json', out],
      { env: cliEnv, encoding: 'utf8' },
    );
    expect(oracle.status, oracle.stderr).toBe(0);
    expect(JSON.parse(readFileSync(out, 'utf8'))).toMatchObject({ agent: 'oracle', tasks: 5, resolved: 5 });
    const nop = spawnSync('node', [resolve('dist/src/cli/main.js'), 'eval', EXAMPLES, '--agent', 'nop'], {
      env: cliEnv,
      encoding: 'utf8',
    });
    expect(nop.status).toBe(1);
    expect(nop.stderr).toMatch(/0\/5 resolved with --agent nop/);
    const bad = spawnSync('node', [resolve('dist/src/cli/main.js'), 'eval', EXAMPLES, '--agent', 'genius'], {
      env: cliEnv,
      encoding: 'utf8',
    });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/--agent must be one of oracle, nop/);
  });

  it('grades with the base image interpreters, whatever the agent did to them', async () => {
    const forge = '#!/bin/sh\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n';
    const cheats: SandboxAction[] = [
      { type: 'write_file', path: '/tmp/fake', content: forge },
      {
        type: 'exec',
        command:
          'cp /tmp/fake /bin/bash && cp /tmp/fake /usr/bin/python3 && chmod +x /bin/bash /usr/bin/python3',
      },
      { type: 'submit' },
    ];
    const cheater: Agent = (_o, { stepIndex }) => Promise.resolve(cheats[stepIndex] ?? { type: 'submit' });
    const [report] = await evaluate(
      env.platform,
      await loadTasks([join(EXAMPLES, 'fix-sum')]),
      () => cheater,
      { concurrency: 1 },
    );
    expect(report?.reward).toBe(0);
    // Debian merges /usr: /bin is a link, so the write lands in /usr/bin
    expect(report?.tampered).toContain('/usr/bin');
  });

  it('resumes an interrupted evaluation without re-running finished episodes', async () => {
    const tasks = (await loadTasks([EXAMPLES])).slice(0, 2);
    const journal = await EvalJournal.open(join(env.dataDir, 'evals', 'resume.jsonl'));
    let started = 0;
    const counting = (): Agent => {
      started++;
      return oracleAgent();
    };
    // the first run is "killed" after its first episode: only that one is in the journal
    const [first] = await evaluate(env.platform, tasks.slice(0, 1), counting, { concurrency: 1, journal });
    const reopened = await EvalJournal.open(journal.path);
    const resumed = await evaluate(env.platform, tasks, counting, { concurrency: 1, journal: reopened });
    expect(started).toBe(2);
    expect(resumed[0]).toEqual(first);
    expect(resumed.map((r) => r.reward)).toEqual([1, 1]);
  });

  it('judges OJ programs case by case, and names a malformed problem', async () => {
    const [problem] = await loadTasks([join(EXAMPLES, 'oj-sum-pairs.oj.json')]);
    const wrong = scriptedAgent([
      { type: 'write_file', path: '/work/solution.py', content: 'print(3)\nprint(6)\n' },
    ]);
    await using task = TaskEnv.create(env.platform, problem!);
    await task.reset();
    await task.step({ type: 'write_file', path: '/work/solution.py', content: 'print(3)\nprint(6)\n' });
    const graded = await task.grade();
    expect(graded.reward).toBe(0);
    expect(graded.details).toMatchObject({
      cases: ['accepted', 'wrong_answer', 'wrong_answer'],
      passed: 1,
      total: 3,
    });
    const [report] = await evaluate(env.platform, [problem!], () => wrong, { concurrency: 1 });
    expect(report?.reward).toBe(0);
    const bad = join(env.dataDir, 'bad.oj.json');
    await writeFile(bad, JSON.stringify({ id: 'x', statement: 's', language: 'cobol', tests: [] }));
    await expect(loadTasks([bad])).rejects.toThrow(/bad\.oj\.json: language: .*; tests: /);
  });

  it('lets a custom verifier intercept the chain', async () => {
    const halve: Verifier = async (_context, next) => {
      const verdict = await next();
      return { ...verdict, reward: verdict.reward / 2, details: { ...verdict.details, halved: true } };
    };
    await using task = TaskEnv.create(env.platform, await loadHarborTask(join(EXAMPLES, 'hello-file')), {
      verifiers: [halve],
    });
    await task.reset();
    await task.step({ type: 'exec', command: 'echo "hello sandgym" > /app/hello.txt' });
    const graded = await task.grade();
    expect(graded.reward).toBe(0.5);
    expect(graded.details['halved']).toBe(true);
  });

  it('catches every cheat in examples/agents, and raises its signal where it leaves a trace', async () => {
    const tasks = await loadTasks([EXAMPLES]);
    // what each cheat must leave in its report (cheats that only read or print leave nothing to flag)
    const signals: Record<string, (report: EpisodeReport) => boolean> = {
      'cheat-reward-file': (r) => r.tampered.includes('/logs/verifier'),
      'cheat-replace-tests': (r) => r.tampered.includes('/tests'),
      'cheat-forge-interpreter': (r) => r.tampered.some((path) => path === '/usr/bin' || path === '/bin'),
      'cheat-network-fetch': (r) => (r.deniedEgress ?? 0) >= 1,
    };
    for (const [name, actions] of Object.entries(CHEATS)) {
      const reports = await evaluate(env.platform, tasks, () => scriptedAgent(actions), { concurrency: 2 });
      for (const report of reports) {
        expect(report.reward, `${name} on ${report.task}`).toBe(0);
        expect(report.outcome.kind, `${name} on ${report.task}`).toBe('ok');
        const signal = signals[name];
        if (signal) expect(signal(report), `${name} on ${report.task}: ${JSON.stringify(report)}`).toBe(true);
      }
    }
  });

  it('carries a per-stage network policy and refuses a rule this node does not define', async () => {
    const online = await taskCopy('online', (d) =>
      writeFile(
        join(d, 'task.toml'),
        '[environment]\nallow_internet = true\n[verifier]\nnetwork_mode = "no-network"\n',
      ),
    );
    const task = await loadHarborTask(online);
    expect(task.network).toEqual({ setup: [...PUBLIC_NETWORK], agent: [...PUBLIC_NETWORK], verify: [] });
    expect(task.hiddenPaths).toEqual(['/tests', '/solution']);
    const closed = await taskCopy('offline', (d) =>
      writeFile(join(d, 'task.toml'), '[environment]\nnetwork_mode = "no-network"\n'),
    );
    expect((await loadHarborTask(closed)).network).toEqual({ setup: [], agent: [], verify: [] });
    // public asks for the internet where there is one: this node has none (only its mirrors), and
    // the task runs with what there is rather than failing
    const [report] = await evaluate(env.platform, [task], oracleAgent, { concurrency: 1 });
    expect(report).toMatchObject({ reward: 1, outcome: { kind: 'ok' } });
    // a rule the task needs, not merely allows, is refused by name
    await using taskEnv = TaskEnv.create(env.platform, {
      ...task,
      network: { ...task.network, agent: ['internet'] },
    });
    await expectCode(taskEnv.reset(), 'invalid_argument', /"internet" is not defined on this node/);
  });

  it('scores an agent that plays for time at its budget, instead of masking the episode', async () => {
    const tight = await taskCopy('tight-budget', (d) =>
      writeFile(join(d, 'task.toml'), '[agent]\ntimeout_sec = 2\n'),
    );
    // 10: run out the clock, hoping the cut-off counts as infrastructure noise
    const stall = scriptedAgent([{ type: 'exec', command: ['sleep', '600'] }]);
    const [report] = await evaluate(env.platform, [await loadHarborTask(tight)], () => stall, {
      concurrency: 1,
    });
    expect(report).toMatchObject({ reward: 0, outcome: { kind: 'ok' }, timeout: { budgetMs: 2000 } });
    // the sleep was cut at the budget, not waited out
    const [stalled] = await (await env.platform.stepLog(report!.sandboxId!)).records();
    expect(stalled?.result).toMatchObject({ observation: { type: 'exec', timedOut: true } });
  });

  it("reports a verifier that runs out of time even without the agent's changes as verifier_error", async () => {
    const slow = await taskCopy('slow-verifier', async (d) => {
      await writeFile(join(d, 'task.toml'), '[verifier]\ntimeout_sec = 0.5\n');
      await writeFile(join(d, 'tests', 'test.sh'), '#!/bin/bash\nsleep 30\n', { mode: 0o755 });
    });
    const [report] = await evaluate(env.platform, [await loadHarborTask(slow)], oracleAgent, {
      concurrency: 1,
    });
    expect(report?.outcome).toMatchObject({
      kind: 'verifier_error',
      message: expect.stringMatching(
        /ran out of their 500 ms.*without them too.*verifier is at fault/,
      ) as unknown,
    });
  });
});
