import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { STORE_DIR, createTestPlatform, type TestPlatform } from '../support/platform.ts';

const CLI = resolve('dist/src/cli/main.js');

/** The README's exit-code table: each row's first cell, and which codes it names. */
function readmeRows(): Map<string, Set<number>> {
  const section = readFileSync(resolve('README.md'), 'utf8').split('### Exit codes')[1] ?? '';
  const rows = new Map<string, Set<number>>();
  for (const line of section.split('\n')) {
    if (!line.startsWith('| `sandgym')) continue;
    const [command = '', ...cells] = line
      .split('|')
      .slice(1, -1)
      .map((cell) => cell.trim());
    rows.set(command, new Set([0, 1, 2, 3].filter((code) => (cells[code] ?? '') !== '')));
  }
  return rows;
}

interface Case {
  args: string[];
  code: number;
  stderr?: RegExp;
  env?: Record<string, string>;
}

const UNKNOWN_ID = 'sg-local-aaaaaaaaaaaa';
const HELLO = resolve('examples/tasks/hello-file');
const NODE_TOKEN = { SANDGYM_NODE_TOKEN: 'exit-code-test-node-token-5e1f' };

describe("each row of the README's exit-code table", () => {
  let env: TestPlatform | undefined;

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run "npm run build"`);
    env = await createTestPlatform('exitcodes');
    await writeFile(join(env.dataDir, 'grants.json'), JSON.stringify({ tokens: {} }));
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  /** Cheap cases for each row, by the row's first cell: a code the row names, and how to get it. */
  function cases(
    dataDir = env?.dataDir ?? '',
    grants = join(dataDir, 'grants.json'),
  ): Record<string, Case[]> {
    return {
      '`sandgym --help`, `--version`, `COMMAND --help`': [
        { args: ['--version'], code: 0 },
        { args: ['run', '--help'], code: 0 },
        { args: ['frobnicate'], code: 2, stderr: /unknown command "frobnicate"/ },
      ],
      '`sandgym run`': [
        { args: ['run', '--env', 'busybox:latest', '--', 'true'], code: 0 },
        { args: ['run', '--env', 'busybox:latest', '--', 'false'], code: 1 },
        {
          args: ['run', '--env', 'nosuch:1', '--', 'true'],
          code: 2,
          stderr: /Unknown environment "nosuch:1"/,
        },
      ],
      '`sandgym ps`, `gc`, `layer ls`, `layer gc`, `env ls`': [
        { args: ['ps'], code: 0 },
        { args: ['env', 'ls', '--json', '/proc/sandgym.json'], code: 2, stderr: /cannot be written/ },
      ],
      '`sandgym kill`, `audit`, `env show`': [
        { args: ['kill', UNKNOWN_ID], code: 2 },
        { args: ['audit', UNKNOWN_ID], code: 2, stderr: /no sandbox "sg-local-aaaaaaaaaaaa"/ },
        { args: ['env', 'show', 'nosuch:1'], code: 2 },
        { args: ['env', 'show', 'busybox:latest'], code: 0 },
      ],
      '`sandgym create`': [
        { args: ['create', '--memory-mib', '-5'], code: 2, stderr: /--memory-mib must be a whole number/ },
        { args: ['create', '--env', 'nosuch:1'], code: 2, stderr: /Unknown environment "nosuch:1"/ },
      ],
      '`sandgym env rm`': [
        { args: ['env', 'rm'], code: 2, stderr: /give one environment/ },
        { args: ['env', 'rm', 'nosuch:1'], code: 2 },
      ],
      '`sandgym eval`': [
        { args: ['eval', HELLO, '--agent', 'nop'], code: 1, stderr: /0\/1 resolved/ },
        {
          args: ['eval', HELLO, '--report', '/proc/sandgym.html'],
          code: 2,
          stderr: /--report .* cannot be written/,
        },
      ],
      '`sandgym check`': [{ args: ['check'], code: 2, stderr: /give task folders/ }],
      '`sandgym layer build`, `layer pull`': [
        {
          args: ['layer', 'build', '--from-dir', '.', '--from-tar', 'x.tar'],
          code: 2,
          stderr: /exactly one source/,
        },
      ],
      '`sandgym node`, `controller`, `proxy`, `mcp`': [
        {
          args: ['node', '--listen', 'not an address'],
          code: 2,
          stderr: /--listen takes HOST:PORT/,
          env: NODE_TOKEN,
        },
        {
          // TEST-NET-1 is on no interface here: the bind fails, and the process still ends
          args: ['controller', '--listen', '192.0.2.1:7000', '--nodes', '127.0.0.1:9', '--grants', grants],
          code: 3,
          stderr: /Cannot listen on 192.0.2.1:7000/,
          env: NODE_TOKEN,
        },
      ],
      '`sandgym node drain`, `node undrain`': [
        { args: ['node', 'drain'], code: 2, stderr: /give --node HOST:PORT/ },
        {
          args: ['node', 'undrain', '--node', '127.0.0.1:9'],
          code: 3,
          stderr: /not reachable/,
          env: NODE_TOKEN,
        },
      ],
      '`sandgym setup`, `bench`, `certs`': [
        { args: ['bench', 'nosuch'], code: 2, stderr: /unknown benchmark "nosuch"/ },
        { args: ['certs', '--out', join(dataDir, 'certs'), '--hosts', 'bad host!'], code: 2 },
        { args: ['certs', '--out', join(dataDir, 'certs')], code: 0 },
      ],
    };
  }

  it('has cases here for every row of it, each naming a code its row names', () => {
    const rows = readmeRows();
    expect(Object.keys(cases()).sort()).toEqual([...rows.keys()].sort());
    for (const [row, list] of Object.entries(cases()))
      for (const { code } of list) expect(rows.get(row)?.has(code), `${row} names exit ${code}`).toBe(true);
  });

  it.each(Object.keys(cases()))('%s', (row) => {
    for (const { args, code, stderr, env: extra } of cases()[row] ?? []) {
      const run = spawnSync('node', [CLI, ...args], {
        env: { ...process.env, SANDGYM_DATA_DIR: env!.dataDir, SANDGYM_STORE: STORE_DIR, ...extra },
        encoding: 'utf8',
        timeout: 120_000,
      });
      expect(run.status, `sandgym ${args.join(' ')}: ${run.stderr}`).toBe(code);
      if (stderr) expect(run.stderr, args.join(' ')).toMatch(stderr);
    }
  });
});
