// Red team of `sandgym create` and its holders, driven through the real CLI (dist/): another
// project of this host (its own $SANDGYM_PROJECT, the CLI only), the agent inside a created
// sandbox, and a sloppy user who kills a holder hard. An attack that works is an `it.fails`
// OPEN BREAK asserting the safe outcome; each has an honest twin that passes.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { STORE_DIR } from '../support/platform.ts';

const CLI = resolve('dist/src/cli/main.js');
const ENV = 'busybox:latest';
// projects no other test names: what a break writes lands in their part of the store
const VICTIM = 'redcli-victim';
const OTHER = 'redcli-other';

describe('sandgym create holders under attack', () => {
  let dataDir: string;

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run "npm run build"`);
    dataDir = await mkdtemp(join(tmpdir(), 'sandgym-red-cli-'));
  });

  afterAll(async () => {
    // whatever a test left: every holder ends its sandbox on SIGTERM; gc reaps orphans
    for (const name of holderFiles()) {
      const pid = Number(name.replace('.json', ''));
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        // already gone
      }
    }
    await sleep(2_000);
    sandgym(VICTIM, 'gc');
    await rm(dataDir, { recursive: true, force: true });
  });

  function sandgym(
    project: string,
    ...args: string[]
  ): { status: number | null; stdout: string; stderr: string } {
    const run = spawnSync('node', [CLI, ...args], {
      env: { ...process.env, SANDGYM_DATA_DIR: dataDir, SANDGYM_STORE: STORE_DIR, SANDGYM_PROJECT: project },
      encoding: 'utf8',
      timeout: 120_000,
    });
    return { status: run.status, stdout: run.stdout, stderr: run.stderr };
  }

  /** Whether process `pid` is there and not a zombie. */
  function processRuns(pid: number): boolean {
    const status = existsSync(`/proc/${pid}/status`) ? readFileSync(`/proc/${pid}/status`, 'utf8') : '';
    return status !== '' && !/^State:\s+Z/m.test(status);
  }

  function holderFiles(): string[] {
    return existsSync(join(dataDir, 'holders')) ? readdirSync(join(dataDir, 'holders')) : [];
  }

  function liveIds(): string[] {
    return sandgym(VICTIM, 'ps')
      .stdout.split('\n')
      .slice(1)
      .map((line) => line.split(/\s+/)[0] ?? '')
      .filter(Boolean);
  }

  /** A sandbox alpha created, with its holder's pid; killed in `finally` by its own project. */
  async function withCreated(body: (id: string, holderPid: number) => void | Promise<void>): Promise<void> {
    const made = sandgym(VICTIM, 'create', '--env', ENV, '--json');
    expect(made.status, made.stderr).toBe(0);
    const { id, ownerPid } = JSON.parse(made.stdout) as { id: string; ownerPid: number };
    try {
      await body(id, ownerPid);
    } finally {
      sandgym(VICTIM, 'kill', id);
      sandgym(VICTIM, 'gc');
    }
  }

  it('another project can neither exec in nor kill a held sandbox (twin)', async () => {
    await withCreated((id) => {
      const exec = sandgym(OTHER, 'exec', id, '--', 'id');
      expect(exec.status).toBe(2);
      expect(exec.stdout).toBe('');
      expect(sandgym(OTHER, 'kill', id).status).toBe(2);
      expect(liveIds()).toContain(id);
      expect(sandgym(VICTIM, 'exec', id, '--', 'true').status).toBe(0);
    });
  });

  it('exec exit codes tell the truth: own code, 128 + signal', async () => {
    await withCreated((id) => {
      const seven = sandgym(VICTIM, 'exec', id, '--', 'sh', '-c', 'echo out; echo err >&2; exit 7');
      expect(seven).toMatchObject({ status: 7, stdout: 'out\n' });
      expect(seven.stderr).toContain('err\n');
      expect(sandgym(VICTIM, 'exec', id, '--', 'sh', '-c', 'kill -9 $$').status).toBe(137);
    });
  });

  it("the agent inside cannot reach the holder's loopback node agent", async () => {
    await withCreated((id, holderPid) => {
      const record = JSON.parse(readFileSync(join(dataDir, 'holders', `${holderPid}.json`), 'utf8')) as {
        port: number;
      };
      // every address the sandbox has a route to, plus its own loopback
      const probe = `for h in 127.0.0.1 $(ip route | awk '{print $3}' | grep -E '^[0-9.]+$'); do nc -w 2 $h ${record.port} </dev/null && echo OPEN-$h; done; echo probed`;
      const run = sandgym(VICTIM, 'exec', id, '--', 'sh', '-c', probe);
      expect(run.stdout).toContain('probed');
      expect(run.stdout).not.toContain('OPEN');
    });
  });

  it('a created sandbox past its idle TTL ends, holder and record too', async () => {
    const made = sandgym(VICTIM, 'create', '--env', ENV, '--idle-ttl', '2s', '--json');
    expect(made.status, made.stderr).toBe(0);
    const { id, ownerPid } = JSON.parse(made.stdout) as { id: string; ownerPid: number };
    try {
      // poll (no wall-clock threshold: the vitest timeout is the bound)
      while (liveIds().includes(id) || holderFiles().includes(`${ownerPid}.json`)) await sleep(500);
      // the holder removes its record, then closes its agent and exits (a zombie counts as gone)
      while (processRuns(ownerPid)) await sleep(250);
    } finally {
      sandgym(VICTIM, 'kill', id);
    }
  }, 60_000);

  it("CLOSED: another project kills a project's live `sandgym run` sandbox", async () => {
    // the command outlives any slow start on a loaded machine; the test ends it itself
    const run = spawn('node', [CLI, 'run', '--env', ENV, '--', 'sleep', '600'], {
      env: { ...process.env, SANDGYM_DATA_DIR: dataDir, SANDGYM_STORE: STORE_DIR, SANDGYM_PROJECT: VICTIM },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let runErrors = '';
    run.stderr.on('data', (chunk: Buffer) => (runErrors += chunk.toString()));
    let runExit: number | null | undefined;
    const exited = new Promise<void>((done) =>
      run.once('exit', (code) => {
        runExit = code;
        done();
      }),
    );
    try {
      let ids = liveIds();
      while (ids.length === 0) {
        // a run that failed to start would otherwise leave this loop polling until the timeout
        if (runExit !== undefined)
          throw new Error(`sandgym run exited ${runExit} before its sandbox showed: ${runErrors}`);
        await sleep(250);
        ids = liveIds();
      }
      const [id] = ids;
      // safe outcome: the other project's kill names nothing of its own (2) and the victim's command runs on
      expect(sandgym(OTHER, 'kill', id ?? '').status).toBe(2);
      expect(liveIds()).toContain(id);
      expect(runExit, runErrors).toBeUndefined();
    } finally {
      run.kill('SIGTERM');
      await exited;
    }
  }, 180_000);

  it("CLOSED: another project kills a project's orphaned held sandbox", async () => {
    await withCreated(async (id, holderPid) => {
      process.kill(holderPid, 'SIGKILL');
      while (liveIds().includes(id) && !sandgym(VICTIM, 'ps').stdout.includes('orphaned')) await sleep(250);
      expect(sandgym(OTHER, 'kill', id).status).toBe(2);
      expect(liveIds()).toContain(id);
    });
  }, 60_000);

  it("CLOSED: another project packs a held sandbox's files into an environment", async () => {
    await withCreated((id) => {
      expect(sandgym(VICTIM, 'exec', id, '--', 'sh', '-c', 'echo SECRET > /root/secret').status).toBe(0);
      const name = `redcli${process.pid}:1`;
      try {
        // safe outcome: the other project cannot see the sandbox at all, as exec and kill cannot
        const build = sandgym(OTHER, 'layer', 'build', '--from-sandbox', id, '--name', name);
        expect(build.status).toBe(2);
      } finally {
        sandgym(VICTIM, 'env', 'rm', name);
        sandgym(OTHER, 'env', 'rm', name);
      }
    });
  }, 90_000);

  it("CLOSED: another project replaces a project's environment with a held sandbox's state", async () => {
    const name = `redcli${process.pid}y:1`;
    await withCreated((id) => {
      try {
        // the victim keeps a clean environment made from its sandbox...
        expect(sandgym(VICTIM, 'layer', 'build', '--from-sandbox', id, '--name', name).status).toBe(0);
        // ...then the untrusted agent in that sandbox plants a file...
        expect(sandgym(VICTIM, 'exec', id, '--', 'sh', '-c', 'echo BACKDOOR > /bin/planted').status).toBe(0);
        // ...and another project packs the sandbox again under the victim's name
        sandgym(OTHER, 'layer', 'build', '--from-sandbox', id, '--name', name);
        // safe outcome: the victim's environment is the one it made
        expect(sandgym(VICTIM, 'run', '--env', name, '--', 'cat', '/bin/planted').stdout).toBe('');
      } finally {
        sandgym(VICTIM, 'env', 'rm', name);
        sandgym(OTHER, 'env', 'rm', name);
      }
    });
  }, 120_000);

  it("honest twin: a project packs its own held sandbox's files into an environment it runs", async () => {
    await withCreated((id) => {
      expect(sandgym(VICTIM, 'exec', id, '--', 'sh', '-c', 'echo SECRET > /root/secret').status).toBe(0);
      const name = `redcli${process.pid}x:1`;
      try {
        expect(sandgym(VICTIM, 'layer', 'build', '--from-sandbox', id, '--name', name).status).toBe(0);
        expect(sandgym(VICTIM, 'run', '--env', name, '--', 'cat', '/root/secret').stdout).toBe('SECRET\n');
      } finally {
        sandgym(VICTIM, 'env', 'rm', name);
        sandgym(OTHER, 'env', 'rm', name);
      }
    });
  }, 90_000);
});
