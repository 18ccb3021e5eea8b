import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { cp, mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SandboxEnv } from '../../src/env/index.ts';
import { Platform } from '../../src/platform/index.ts';
import { STORE_DIR, createTestPlatform, type TestPlatform } from '../support/platform.ts';

const CLI = resolve('dist/src/cli/main.js');

describe('the sandgym command line', () => {
  let env: TestPlatform;
  let cliEnv: NodeJS.ProcessEnv;

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run "npm run build" (npm test does)`);
    env = await createTestPlatform('cli');
    cliEnv = { ...process.env, SANDGYM_DATA_DIR: env.dataDir, SANDGYM_STORE: STORE_DIR };
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  function sandgym(...args: string[]): { status: number | null; stdout: string; stderr: string } {
    const run = spawnSync('node', [CLI, ...args], { env: cliEnv, encoding: 'utf8', timeout: 120_000 });
    return { status: run.status, stdout: run.stdout, stderr: run.stderr };
  }

  it("prints this package's version for --version, and exits 0", () => {
    const { version } = JSON.parse(readFileSync(resolve('package.json'), 'utf8')) as { version: string };
    for (const flag of ['--version', '-V']) {
      const run = sandgym(flag);
      expect(run, flag).toMatchObject({ status: 0, stdout: `${version}\n`, stderr: '' });
    }
  });

  it('runs python3 on the Debian base and prints one JSON document', () => {
    const run = sandgym('run', '--json', '--', 'python3', '-c', 'print(6*7)');
    expect(run.stderr).toBe('');
    expect(run.status).toBe(0);
    const document = JSON.parse(run.stdout) as Record<string, unknown>;
    expect(document).toMatchObject({ stdout: '42\n', exitCode: 0, backend: 'container', timedOut: false });
  });

  it('exits 2, naming the file and line, for a task that cannot run as written', async () => {
    const broken = {
      'a failing RUN': 'FROM debian:bookworm\nRUN exit 7\n',
      'a missing COPY source': 'FROM debian:bookworm\nCOPY missing.txt /x\n',
      'an unknown instruction': 'FROM debian:bookworm\nFROBNICATE x\n',
    };
    for (const [what, dockerfile] of Object.entries(broken)) {
      const dir = join(env.dataDir, 'tasks', what.replace(/\W+/g, '-'));
      await cp(resolve('examples/tasks/hello-file'), dir, { recursive: true });
      await writeFile(join(dir, 'environment', 'Dockerfile'), dockerfile);
      for (const command of [
        ['eval', dir, '--agent', 'nop'],
        ['check', dir],
      ]) {
        const run = sandgym(...command);
        expect(run.status, `${command[0]} with ${what}: ${run.stderr}`).toBe(2);
        expect(run.stderr, what).toMatch(/Dockerfile line 2/);
      }
    }
  });

  it('evaluates a multi-metric task with each metric kept, and builds FROM an unknown image only on a fallback asked for', async () => {
    const out = join(env.dataDir, 'multi-metric.json');
    const run = sandgym('eval', resolve('test/fixtures/tasks/harbor/multi-metric'), '--json', out);
    expect(run.status, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/multi-metric: reward 1 \(correctness 1, style 1\)/);
    const summary = JSON.parse(readFileSync(out, 'utf8')) as { meanMetrics: Record<string, number> };
    expect(summary.meanMetrics).toEqual({ correctness: 1, style: 1 });

    const dir = join(env.dataDir, 'tasks', 'from-ubuntu');
    await cp(resolve('examples/tasks/hello-file'), dir, { recursive: true });
    await writeFile(join(dir, 'environment', 'Dockerfile'), 'FROM ubuntu:22.04\nWORKDIR /app\n');
    const refused = sandgym('eval', dir, '--agent', 'oracle');
    expect(refused.status).toBe(2);
    expect(refused.stderr).toMatch(/FROM ubuntu:22.04: not in the store and not pulled .*--fallback-base/);
    const fallback = sandgym('eval', dir, '--agent', 'oracle', '--fallback-base', 'debian:bookworm');
    expect(fallback.status, fallback.stderr).toBe(0);
    expect(fallback.stderr).toMatch(
      /from-ubuntu: FROM ubuntu:22.04: not in the store .*built on debian:bookworm instead, as asked/,
    );
  });

  it('refuses a data folder on a kernel filesystem or a read-only mount at once, naming the setting', async () => {
    const onProc = spawnSync('node', [CLI, 'run', '--', 'true'], {
      env: { ...cliEnv, SANDGYM_DATA_DIR: '/proc/sandgym-data' },
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(onProc.status).toBe(2);
    expect(onProc.stderr).toMatch(/\/proc\/sandgym-data is on procfs.*SANDGYM_DATA_DIR/);
    const readOnly = join(env.dataDir, 'read-only');
    await mkdir(readOnly, { recursive: true });
    spawnSync('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', readOnly]);
    try {
      const run = spawnSync('node', [CLI, 'run', '--', 'true'], {
        env: { ...cliEnv, SANDGYM_DATA_DIR: join(readOnly, 'data') },
        encoding: 'utf8',
        timeout: 30_000,
      });
      expect(run.status).toBe(2);
      expect(run.stderr).toMatch(/cannot be written .*read-only.*SANDGYM_DATA_DIR/);
    } finally {
      spawnSync('umount', [readOnly]);
    }
  });

  it('audits a sandbox from another process: its signals and its command history', async () => {
    await using gym = SandboxEnv.create(env.platform, {
      sandbox: { environment: 'busybox:latest', resources: { pids: 16 } },
      protectedPaths: ['/bin', '/usr/bin'],
    });
    await gym.reset();
    await gym.step({ type: 'exec', command: 'wget -O - http://10.0.0.1/ 2>/dev/null; echo tried' });
    await gym.step({ type: 'exec', command: 'rm /bin/ls; sleep 600 >/dev/null 2>&1 &' });
    await gym.step({ type: 'exec', command: 'for i in $(seq 40); do sleep 5 & done; true' });
    const id = gym.current!.id;
    const audit = sandgym('audit', id, '--json');
    expect(audit.status, audit.stderr).toBe(0);
    const report = JSON.parse(audit.stdout) as {
      signals: {
        deniedEgress: number;
        protectedChanges: string[];
        limitsHit: string[];
        leftoverProcesses: number;
      };
      steps: { stepIndex: number; action: string; exitCode: number }[];
    };
    expect(report.steps.map((s) => s.stepIndex)).toEqual([0, 1, 2]);
    expect(report.steps[0]?.action).toContain('wget');
    expect(report.signals.deniedEgress).toBeGreaterThanOrEqual(1);
    expect(report.signals.protectedChanges).toContain('/bin/ls');
    expect(report.signals.limitsHit).toContain('pids');
    expect(report.signals.leftoverProcesses).toBeGreaterThanOrEqual(1);
    const text = sandgym('audit', id);
    expect(text.stdout).toMatch(/denied egress \d+; protected paths changed: \/bin\/ls/);
    expect(text.stdout).toContain('steps: 3');
    expect(sandgym('audit', 'sg-local-aaaaaaaaaaaa').status).toBe(2);
  });

  it('streams output and exits 1 when the command fails', () => {
    const run = sandgym('run', '--env', 'busybox:latest', '--', 'sh', '-c', 'echo visible; exit 3');
    expect(run.stdout).toBe('visible\n');
    expect(run.stderr).toMatch(/exit 3/);
    expect(run.status).toBe(1);
  });

  it('exits 2 with a message naming the bad argument', () => {
    const cases: [string[], RegExp][] = [
      [['run', '--'], /command is empty/],
      [['run', '--env', 'nosuch:1', '--', 'true'], /Unknown environment "nosuch:1"/],
      [
        ['run', '--memory-mib', '4', '--', 'true'],
        /--memory-mib must be a whole number from 16 to \d+, got 4/,
      ],
      [
        ['run', '--timeout-ms', 'soon', '--', 'true'],
        /--timeout-ms must be a whole number from 1 to \d+, got soon/,
      ],
      [['run', '--frobnicate', '--', 'true'], /frobnicate/],
      [['frobnicate'], /unknown command "frobnicate"/],
      [['bench', 'nosuch'], /unknown benchmark "nosuch"/],
    ];
    for (const [args, message] of cases) {
      const run = sandgym(...args);
      expect(run.status, args.join(' ')).toBe(2);
      expect(run.stderr, args.join(' ')).toMatch(message);
    }
  });

  it('lists and kills a sandbox that another process owns', async () => {
    const owner = await Platform.local({ dataDir: env.dataDir, storeDir: STORE_DIR });
    try {
      const sandbox = await owner.createSandbox({ environment: 'busybox:latest' });
      const listed = JSON.parse(sandgym('ps', '--json').stdout) as {
        sandboxes: { id: string; state: string; ownerPid: number }[];
      };
      expect(listed.sandboxes).toContainEqual(
        expect.objectContaining({ id: sandbox.id, state: 'running', ownerPid: process.pid }),
      );
      expect(sandgym('kill', sandbox.id).status).toBe(0);
      for (let i = 0; i < 100 && sandbox.state === 'running'; i++) await sleep(20);
      expect(sandbox.state).toBe('failed');
      expect(sandbox.failure).toBe('agent_crash');
      expect(sandgym('kill', sandbox.id).status).toBe(2);
      await sandbox.close();
    } finally {
      await owner.close();
    }
  });

  it('leaves residue on SIGKILL that gc removes completely', async () => {
    const child = spawn(
      'node',
      [CLI, 'run', '--env', 'busybox:latest', '--', 'sh', '-c', 'echo started; sleep 600'],
      {
        env: cliEnv,
        stdio: ['ignore', 'pipe', 'ignore'],
      },
    );
    let id: string | undefined;
    try {
      // kill it once the command inside runs: the sandbox is fully up, not half-way through crun
      await new Promise<void>((started) =>
        child.stdout.on('data', (d: Buffer) => d.toString().includes('started') && started()),
      );
      for (let i = 0; i < 300 && !id; i++) {
        await sleep(50);
        const listed = JSON.parse(sandgym('ps', '--json').stdout) as {
          sandboxes: { id: string; ownerPid: number }[];
        };
        id = listed.sandboxes.find((s) => s.ownerPid === child.pid)?.id;
      }
      expect(id, 'the CLI started a sandbox').toBeDefined();
    } finally {
      child.kill('SIGKILL');
      await new Promise((done) => child.once('exit', done));
    }
    const orphaned = JSON.parse(sandgym('ps', '--json').stdout) as {
      sandboxes: { id: string; state: string }[];
    };
    expect(orphaned.sandboxes).toContainEqual(expect.objectContaining({ id, state: 'orphaned' }));
    const gc = JSON.parse(sandgym('gc', '--json').stdout) as { sandboxes: string[]; mounts: string[] };
    expect(gc.sandboxes).toContain(id);
    expect(readdirSync(join(env.dataDir, 'sandboxes'))).toEqual([]);
    expect(readdirSync(join(env.dataDir, 'runtime'))).toEqual([]);
    for (const hierarchy of readdirSync('/sys/fs/cgroup')) {
      const scopes = existsSync(join('/sys/fs/cgroup', hierarchy, 'sandgym'))
        ? readdirSync(join('/sys/fs/cgroup', hierarchy, 'sandgym'))
        : [];
      for (const scope of scopes)
        expect(existsSync(join('/sys/fs/cgroup', hierarchy, 'sandgym', scope, id ?? ''))).toBe(false);
    }
    expect(spawnSync('pgrep', ['-f', `sandboxes/${id}`]).status).toBe(1);
  });

  it('logs a controller as pino JSON lines on stderr at --log-level, and refuses an unknown level', async () => {
    const grants = join(env.dataDir, 'grants.json');
    await writeFile(grants, JSON.stringify({ tokens: {} }));
    const token = 'log-test-node-token-7c1e9a4f2b8d6035';
    const controllerArgs = (level: string): string[] => [
      CLI,
      'controller',
      '--listen',
      '127.0.0.1:0',
      '--nodes',
      '127.0.0.1:9',
      '--grants',
      grants,
      '--log-level',
      level,
    ];
    const controllerEnv = { ...cliEnv, SANDGYM_NODE_TOKEN: token };
    const bad = spawnSync('node', controllerArgs('loud'), {
      env: controllerEnv,
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(bad.status).toBe(2);
    expect(bad.stderr).toMatch(/--log-level must be one of debug, info, warn, error, silent/);
    // stderr is a pipe, not a terminal: one JSON object per line
    const controller = spawn('node', controllerArgs('debug'), {
      env: controllerEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    controller.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    try {
      for (let polls = 0; !stderr.includes('\n'); polls++) {
        if (polls > 300) throw new Error(`the controller logged nothing: ${stderr}`);
        await sleep(100);
      }
    } finally {
      controller.kill('SIGKILL');
    }
    const lines = stderr
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(lines[0]).toMatchObject({ app: 'sandgym', role: 'controller' });
    expect(typeof lines[0]?.['level']).toBe('number');
    expect(typeof lines[0]?.['msg']).toBe('string');
  });
});
