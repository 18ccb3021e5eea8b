/**
 * Harbor task.toml fields that reach a running episode: `[environment] workdir` is where the
 * agent's commands run (over the image's WORKDIR), and `[[environment.mcp_servers]]` are handed
 * to the agent in the reset info.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { TaskEnv, loadHarborTask } from '../../src/env/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

let env: TestPlatform;
let dir: string;

beforeAll(async () => {
  env = await createTestPlatform('harbor-task-fields');
  dir = await mkdtemp(join(tmpdir(), 'sandgym-harbor-fields-'));
  const files = {
    'task.toml': [
      '[environment]',
      'network_mode = "no-network"',
      'workdir = "/srv"',
      '[[environment.mcp_servers]]',
      'name = "files"',
      'transport = "stdio"',
      'command = "mcp-files"',
      'args = ["--root", "/srv"]',
    ].join('\n'),
    'instruction.md': 'Do it.\n',
    'environment/Dockerfile': 'FROM busybox:latest\nRUN mkdir /srv\nWORKDIR /\n',
    'tests/test.sh': 'echo 1 > /logs/verifier/reward.txt\n',
  };
  for (const [path, text] of Object.entries(files)) {
    await mkdir(join(dir, path, '..'), { recursive: true });
    await writeFile(join(dir, path), text);
  }
});

afterAll(async () => {
  await env?.[Symbol.asyncDispose]();
  if (dir) await rm(dir, { recursive: true, force: true });
});

it("runs the agent's commands in the task's workdir and hands it the MCP servers", async () => {
  await using task = TaskEnv.create(env.platform, await loadHarborTask(dir));
  const { info } = await task.reset();
  expect(info.mcpServers).toEqual([
    { name: 'files', transport: 'stdio', command: 'mcp-files', args: ['--root', '/srv'], headers: {} },
  ]);
  const { observation } = await task.step({ type: 'exec', command: 'pwd' });
  expect(observation).toMatchObject({ type: 'exec', stdout: '/srv\n', exitCode: 0 });
});

it.each([
  ['hostname:localhost', /"localhost" has no dot/],
  ['hostname:metadata.google.internal', /names the node's own or a local network/],
  ['hostname:169.254.169.254', /is an address/],
])('hostile: a sandbox asking for %s is refused before it starts', async (rule, why) => {
  // a tenant's request reaches the backend without a task loader's checks
  await expect(
    env.platform.createSandbox({ environment: 'busybox:latest', network: [rule] }),
  ).rejects.toThrow(why);
});

// the honest twin, a public host reached by name and another host denied, is the fixture
// checked/harbor-allowed-hosts (fixture-check.test.ts)
