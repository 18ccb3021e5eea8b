import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { commandHelp } from '../../src/cli/command-spec.ts';
import { COMMANDS } from '../../src/cli/registry.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';

const CLI = resolve('dist/src/cli/main.js');

interface Ran {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** The built CLI, run without a shell; several at once (loading it is most of the time). */
function sandgym(args: string[], env: NodeJS.ProcessEnv = process.env): Promise<Ran> {
  return new Promise((done, fail) => {
    const child = spawn('node', [CLI, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', fail);
    child.on('close', (status) => done({ status, stdout, stderr }));
  });
}

describe('the command line, as a new user meets it', () => {
  const dataDir = join(TEST_DATA_ROOT, `cli-help-${process.pid}`);
  const env = { ...process.env, SANDGYM_DATA_DIR: dataDir, SANDGYM_STORE: STORE_DIR };

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run "npm run build"`);
    await mkdir(dataDir, { recursive: true });
  });

  afterAll(async () => {
    await rm(dataDir, { recursive: true, force: true });
  });

  it("prints each command's own help for --help and -h, and exits 0", async () => {
    const asks = COMMANDS.flatMap(({ spec }) => [
      { spec, args: [...spec.name.split(' '), '--help'] },
      // -h too, after other arguments, for the nested commands (the same code serves the rest)
      ...(spec.name.includes(' ') ? [{ spec, args: [...spec.name.split(' '), 'x', '-h'] }] : []),
    ]);
    // two at once: loading the CLI is most of each run, and the host has two cores
    for (let i = 0; i < asks.length; i += 2) {
      const batch = asks.slice(i, i + 2);
      const runs = await Promise.all(batch.map(({ args }) => sandgym(args, env)));
      runs.forEach((run, j) => {
        const { spec, args } = batch[j]!;
        expect(run, args.join(' ')).toMatchObject({
          status: 0,
          stderr: '',
          stdout: `${commandHelp(spec)}\n`,
        });
        for (const name of Object.keys(spec.options))
          expect(run.stdout, `${spec.name} --${name}`).toContain(`--${name}`);
      });
    }
  });

  it('lists every command in sandgym --help and a group in sandgym layer --help', async () => {
    const [top, layer, bare] = await Promise.all([
      sandgym(['--help'], env),
      sandgym(['layer', '--help'], env),
      sandgym(['layer'], env),
    ]);
    expect(top.status).toBe(0);
    for (const { spec } of COMMANDS)
      expect(top.stdout, spec.name).toMatch(new RegExp(`^ {2}${spec.name} `, 'm'));
    expect(layer.status).toBe(0);
    expect(layer.stdout).toMatch(/^ {2}layer build /m);
    expect(bare.status).toBe(2);
    expect(bare.stderr).toMatch(
      /sandgym layer: give a command; one of layer build, layer pull, layer ls, layer gc/,
    );
  });

  it("prints this package's version for --version", async () => {
    const { version } = JSON.parse(readFileSync(resolve('package.json'), 'utf8')) as { version: string };
    expect(await sandgym(['--version'], env)).toMatchObject({ status: 0, stdout: `${version}\n` });
  });

  it('writes --json to stdout alone or with -, else to the file OUT', async () => {
    const out = join(dataDir, 'environments.json');
    const [alone, dash, file] = await Promise.all([
      sandgym(['env', 'ls', '--json'], env),
      sandgym(['env', 'ls', '--json', '-'], env),
      sandgym(['env', 'ls', '--json', out], env),
    ]);
    for (const run of [alone, dash]) {
      expect(run.status, run.stderr).toBe(0);
      const { environments } = JSON.parse(run.stdout) as { environments: { name: string }[] };
      expect(environments.map((e) => e.name)).toContain('busybox');
    }
    expect(dash.stdout).toBe(alone.stdout);
    expect(existsSync('-')).toBe(false);
    expect(file).toMatchObject({ status: 0, stdout: '' });
    expect(JSON.parse(readFileSync(out, 'utf8'))).toEqual(JSON.parse(alone.stdout));
  });

  it('refuses an unwritable --json OUT before any work, and a number out of range naming the flag', async () => {
    const runs = await Promise.all([
      sandgym(['eval', resolve('examples/tasks/hello-file'), '--json', '/proc/sandgym-eval.json'], env),
      sandgym(['run', '--json', join(dataDir, 'no-such-folder', 'run.json'), '--', 'true'], env),
      sandgym(['env', 'ls', '--json', dataDir], env),
      sandgym(['run', '--memory-mib', '99999999', '--', 'true'], env),
      sandgym(['run', '--memory-mib', '-5', '--', 'true'], env),
      sandgym(['node', '--warm-pool', '-1', '--listen', ':0'], env),
    ]);
    const messages = [
      /--json \/proc\/sandgym-eval.json cannot be written/,
      /--json .*run.json cannot be written: its folder does not exist/,
      /--json .* cannot be written: it is a folder/,
      /--memory-mib must be a whole number from 16 to \d+, got 99999999/,
      /--memory-mib must be a whole number from 16 to \d+, got -5/,
      /--warm-pool must be a whole number from 0 to 1024, got -1/,
    ];
    runs.forEach((run, i) => {
      expect(run.status, run.stderr).toBe(2);
      expect(run.stderr).toMatch(messages[i]!);
    });
    // no sandbox was made and no eval started: the check came first
    expect(readdirSync(dataDir).filter((name) => name === 'evals' || name === 'sandboxes')).toEqual([]);
  });
});
