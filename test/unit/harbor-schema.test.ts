/**
 * Harbor's task.toml, field by field: what sandgym makes of each value, its default, and the
 * message that refuses one it cannot honour (naming the field). The same files are held against
 * Harbor's own model in harness-golden.test.ts.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { HostEnvOptions } from '../../src/env/tasks/env-templates.ts';
import { loadHarborTask } from '../../src/env/tasks/harbor.ts';
import type { Task } from '../../src/env/tasks/task.ts';

const folders: string[] = [];

/** Loads a task folder whose task.toml is `toml` (everything else a Harbor task needs beside it). */
async function load(toml: string, options: HostEnvOptions = { hostEnv: {} }): Promise<Task> {
  const dir = await mkdtemp(join(tmpdir(), 'sandgym-harbor-schema-'));
  folders.push(dir);
  for (const [path, text] of Object.entries({
    'task.toml': toml,
    'instruction.md': 'Do it.\n',
    'environment/Dockerfile': 'FROM busybox:latest\n',
    'tests/test.sh': 'echo 1 > /logs/verifier/reward.txt\n',
  })) {
    await mkdir(join(dir, path, '..'), { recursive: true });
    await writeFile(join(dir, path), text);
  }
  return loadHarborTask(dir, options);
}

afterAll(async () => {
  for (const dir of folders) await rm(dir, { recursive: true, force: true });
});

describe('defaults', () => {
  it("are Harbor's: 600 s to verify, 600 s to build, 1 CPU, 2048 MB, public network", async () => {
    const task = await load('');
    expect(task.verifierTimeoutMs).toBe(600_000);
    expect(task.buildTimeoutMs).toBe(600_000);
    expect(task.resources).toEqual({ cpu: 1, memoryMib: 2048 });
    expect(task.network.agent).toContain('internet?');
    // where Harbor grades in the agent's container by default, sandgym grades in a fresh one
    expect(task.verifierMode).toBeUndefined();
    expect(task.workdir).toBeUndefined();
    expect(task.healthcheck).toBeUndefined();
    expect(task.mcpServers).toBeUndefined();
  });

  it('take the deprecated memory and storage sizes, as Harbor converts them', async () => {
    const task = await load('[environment]\nmemory = "1G"\nstorage = "512M"\n');
    expect(task.resources).toEqual({ cpu: 1, memoryMib: 1024, diskMib: 512 });
    await expect(load('[environment]\nmemory = "1G"\nmemory_mb = 2048\n')).rejects.toThrow(
      /environment\.memory: is 1024 MB, but memory_mb is 2048/,
    );
  });
});

describe('[verifier] environment_mode', () => {
  it('"shared" grades in the agent\'s sandbox, "separate" in a fresh one', async () => {
    expect((await load('[verifier]\nenvironment_mode = "shared"\n')).verifierMode).toBe('shared');
    expect((await load('[verifier]\nenvironment_mode = "separate"\n')).verifierMode).toBe('fresh');
  });

  it('refuses another mode, and a separate verifier image, naming the field', async () => {
    await expect(load('[verifier]\nenvironment_mode = "same"\n')).rejects.toThrow(
      /verifier\.environment_mode/,
    );
    await expect(load('[verifier.environment]\ndocker_image = "python:3.12"\n')).rejects.toThrow(
      /verifier\.environment: sandgym grades in a fresh sandbox/,
    );
  });
});

describe('[environment] workdir', () => {
  it('is taken when absolute, refused when relative', async () => {
    expect((await load('[environment]\nworkdir = "/app"\n')).workdir).toBe('/app');
    await expect(load('[environment]\nworkdir = "app"\n')).rejects.toThrow(
      /environment\.workdir: must be an absolute path/,
    );
  });
});

describe('[environment.healthcheck]', () => {
  it("is read in ms, with Docker's and Harbor's defaults", async () => {
    const task = await load('[environment.healthcheck]\ncommand = "test -e /ready"\ninterval_sec = 0.5\n');
    expect(task.healthcheck).toEqual({
      command: 'test -e /ready',
      intervalMs: 500,
      timeoutMs: 30_000,
      startPeriodMs: 0,
      startIntervalMs: 5000,
      retries: 3,
    });
  });

  it('refuses one without a command, or with a negative retry count', async () => {
    await expect(load('[environment.healthcheck]\ninterval_sec = 2\n')).rejects.toThrow(
      /environment\.healthcheck\.command/,
    );
    await expect(load('[environment.healthcheck]\ncommand = "true"\nretries = -1\n')).rejects.toThrow(
      /environment\.healthcheck\.retries/,
    );
  });
});

describe('[[environment.mcp_servers]]', () => {
  it('are handed on, "http" read as streamable HTTP, sse the default transport', async () => {
    const task = await load(
      [
        '[[environment.mcp_servers]]',
        'name = "files"',
        'transport = "stdio"',
        'command = "mcp-files"',
        'args = ["--root", "/app"]',
        '[[environment.mcp_servers]]',
        'name = "search"',
        'transport = "http"',
        'url = "http://search:8000/mcp"',
        '[[environment.mcp_servers]]',
        'name = "events"',
        'url = "http://events:9000/sse"',
      ].join('\n'),
    );
    expect(task.mcpServers).toEqual([
      { name: 'files', transport: 'stdio', command: 'mcp-files', args: ['--root', '/app'], headers: {} },
      { name: 'search', transport: 'streamable-http', url: 'http://search:8000/mcp', args: [], headers: {} },
      { name: 'events', transport: 'sse', url: 'http://events:9000/sse', args: [], headers: {} },
    ]);
  });

  it('refuses a server its transport cannot start', async () => {
    const server = (lines: string) => load(`[[environment.mcp_servers]]\nname = "x"\n${lines}\n`);
    await expect(server('transport = "carrier-pigeon"\nurl = "http://x"')).rejects.toThrow(
      /mcp_servers\.0\.transport/,
    );
    await expect(server('transport = "sse"')).rejects.toThrow(
      /mcp_servers\.0\.url: is required for transport "sse"/,
    );
    await expect(server('transport = "stdio"')).rejects.toThrow(/mcp_servers\.0\.command: is required/);
    await expect(
      server('transport = "stdio"\ncommand = "x"\nheaders = { Authorization = "Bearer ${TOKEN}" }'),
    ).rejects.toThrow(/mcp_servers\.0\.headers: are only for the HTTP transports/);
  });
});

describe('fields sandgym cannot honour', () => {
  it.each([
    ['[environment]\ngpus = 1', /environment\.gpus: this node has no GPUs/],
    ['[environment]\ngpus = "one"', /environment\.gpus/],
    ['[environment.tpu]\ntype = "v6e"\ntopology = "2x4"', /environment\.tpu: this node has no TPUs/],
    ['[environment]\nos = "Windows"', /environment\.os: windows: sandgym runs Linux sandboxes only/],
    [
      '[environment]\nskills_dir = "/skills"',
      /environment\.skills_dir: sandgym's agents have no skills folder/,
    ],
    ['[[steps]]\nname = "one"', /steps: sandgym runs single-step tasks only/],
    ['artifacts = ["/app/out.txt"]', /artifacts: sandgym does not collect artifacts/],
    ['[[verifier.collect]]\ncommand = "true"', /verifier\.collect: sandgym runs no collect hooks/],
  ])('refuses %j, naming the field', async (toml, message) => {
    await expect(load(toml)).rejects.toThrow(message);
  });

  it("takes what asks for nothing: gpus = 0, empty lists, linux, a package's name and metadata", async () => {
    const task = await load(
      [
        'schema_version = "1.4"',
        'artifacts = []',
        '[task]',
        'name = "acme/hello"',
        '[metadata]',
        'difficulty = "easy"',
        '[environment]',
        'gpus = 0',
        'os = "LINUX"',
      ].join('\n'),
    );
    expect(task.resources.cpu).toBe(1);
  });

  it('ignores keys Harbor does not know, as its model does', async () => {
    await expect(
      load('[grading]\nmode = "strict"\n[environment]\nflavour = "large"\n'),
    ).resolves.toBeDefined();
  });
});

describe('env templates (${VAR}, ${VAR:-default})', () => {
  const secrets = { OPENAI_API_KEY: 'sk-users-own-secret', HOME: '/root' };

  it("hostile: a task asking for the user's secret does not get it unless allowed", async () => {
    const asking = '[environment]\nenv = { KEY = "${OPENAI_API_KEY}" }\n';
    const refusal = load(asking, { hostEnv: secrets });
    await expect(refusal).rejects.toThrow(/task\.toml \[environment\] env: KEY = "\$\{OPENAI_API_KEY\}"/);
    await expect(refusal).rejects.toThrow(/not allowed to read: allow it with --task-env OPENAI_API_KEY/);
    // its default is what it gets, never the host's value
    const defaulted = await load('[verifier]\nenv = { KEY = "${OPENAI_API_KEY:-none}" }\n', {
      hostEnv: secrets,
    });
    expect(defaulted.verifierEnv).toEqual({ KEY: 'none' });
    // allowing another name does not allow this one
    const other = await load('[environment]\nenv = { KEY = "${OPENAI_API_KEY:-none}" }\n', {
      hostEnv: { ...secrets, SANDGYM_TASK_ENV: 'HOME' },
    });
    expect(other.env).toEqual({ KEY: 'none' });
  });

  it('honest: an allowed variable is read from the host, by option or $SANDGYM_TASK_ENV', async () => {
    const toml =
      '[environment]\nenv = { KEY = "${OPENAI_API_KEY}", HOME_DIR = "${HOME:-/}", PLAIN = "a${B}" }\n';
    const byOption = await load(toml, { hostEnv: secrets, taskEnv: ['OPENAI_API_KEY'] });
    expect(byOption.env).toEqual({ KEY: 'sk-users-own-secret', HOME_DIR: '/', PLAIN: 'a${B}' });
    const byVariable = await load(toml, {
      hostEnv: { ...secrets, SANDGYM_TASK_ENV: 'OPENAI_API_KEY, HOME' },
    });
    expect(byVariable.env).toEqual({ KEY: 'sk-users-own-secret', HOME_DIR: '/root', PLAIN: 'a${B}' });
  });

  it('an allowed variable the host does not set takes the default, else fails saying so', async () => {
    const options = { hostEnv: {}, taskEnv: ['HF_TOKEN'] };
    expect((await load('[environment]\nenv = { T = "${HF_TOKEN:-}" }\n', options)).env).toEqual({ T: '' });
    await expect(load('[environment]\nenv = { T = "${HF_TOKEN}" }\n', options)).rejects.toThrow(
      /reads the host's HF_TOKEN, which is not set/,
    );
  });
});

describe('network_mode and allowed_hosts', () => {
  it('allowlist: each allowed host by name and the resolver, per phase', async () => {
    const task = await load(
      [
        '[environment]',
        'network_mode = "allowlist"',
        'allowed_hosts = ["Deb.Debian.org.", "pypi.org"]',
        '[agent]',
        'network_mode = "allowlist"',
        'allowed_hosts = ["pypi.org"]',
        '[verifier]',
        'network_mode = "no-network"',
      ].join('\n'),
    );
    expect(task.network).toEqual({
      setup: ['hostname:deb.debian.org', 'hostname:pypi.org', 'dns?'],
      agent: ['hostname:pypi.org', 'dns?'],
      verify: [],
    });
  });

  it('public by default; allow_internet = false is no network unless network_mode says', async () => {
    expect((await load('')).network.verify).toContain('internet?');
    expect((await load('[environment]\nallow_internet = false\n')).network.agent).toEqual([]);
    const both = await load('[environment]\nallow_internet = false\nnetwork_mode = "public"\n');
    expect(both.network.agent).toContain('internet?');
  });

  it.each([
    ['localhost', /allowed_hosts\.0: "localhost" has no dot/],
    ['169.254.169.254', /"169\.254\.169\.254" is an address/],
    ['10.0.0.0/8', /"10\.0\.0\.0\/8" is an address/],
    ['metadata.google.internal', /"metadata\.google\.internal" names the node's own or a local network/],
    ['*.pythonhosted.org', /is a wildcard/],
  ])('hostile: refuses the allowed host %s at load, naming it and why', async (host, why) => {
    await expect(
      load(`[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["${host}"]\n`),
    ).rejects.toThrow(why);
  });

  it('refuses allowed_hosts without network_mode = "allowlist", as Harbor does', async () => {
    await expect(load('[environment]\nallowed_hosts = ["pypi.org"]\n')).rejects.toThrow(
      /environment\.allowed_hosts: allowed_hosts is only valid with network_mode = "allowlist" \(here "public"\)/,
    );
    await expect(load('[agent]\nallowed_hosts = ["pypi.org"]\n')).rejects.toThrow(
      /agent\.allowed_hosts.*unset/,
    );
  });
});
