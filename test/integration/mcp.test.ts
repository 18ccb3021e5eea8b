import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backends/index.ts';
import { createTestPlatform } from '../support/platform.ts';

const CLI = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');

type ToolResult = { content: { type: string; text: string }[]; isError?: boolean };

describe('sandgym mcp', () => {
  it("serves a sandbox's actions as tools to the MCP SDK's own client, and removes the sandbox after", async () => {
    await using test = await createTestPlatform('mcp', { privateStore: true });
    const env = { ...process.env, SANDGYM_DATA_DIR: test.dataDir } as Record<string, string>;
    const client = new Client({ name: 'sandgym-test', version: '1.0.0' });
    const transport = new StdioClientTransport({
      command: 'node',
      args: [CLI, 'mcp', '--environment', 'busybox:latest'],
      env,
      stderr: 'pipe',
    });
    await client.connect(transport);
    try {
      const { tools } = await client.listTools();
      expect(tools.map((t) => t.name).sort()).toEqual(['exec', 'list_dir', 'read_file', 'write_file']);
      expect(tools.find((t) => t.name === 'exec')?.inputSchema.required).toEqual(['command']);
      const call = async (name: string, args: Record<string, unknown>) =>
        (await client.callTool({ name, arguments: args })) as ToolResult;
      const echoed = await call('exec', { command: 'echo hello from $(uname -s)' });
      expect(echoed.isError).toBe(false);
      expect(echoed.content[0]?.text).toBe('hello from Linux\n[exit code 0]');
      const failed = await call('exec', { command: 'exit 3' });
      expect(failed).toMatchObject({ isError: true, content: [{ text: '[exit code 3]' }] });
      await call('write_file', { path: '/root/notes.txt', content: 'kept' });
      expect((await call('read_file', { path: '/root/notes.txt' })).content[0]?.text).toBe('kept');
      expect((await call('list_dir', { path: '/root' })).content[0]?.text).toMatch(/notes\.txt/);
      // a bad argument is the client's to fix: the SDK refuses it before it reaches the sandbox
      const bad = await call('read_file', { path: 42 });
      expect(bad.isError).toBe(true);
      // every call is a step in the sandbox's trajectory log
      const ps = JSON.parse(spawnSync('node', [CLI, 'ps', '--json'], { env, encoding: 'utf8' }).stdout) as {
        sandboxes: { id: string }[];
      };
      expect(ps.sandboxes).toHaveLength(1);
      const audit = spawnSync('node', [CLI, 'audit', ps.sandboxes[0]!.id, '--json'], {
        env,
        encoding: 'utf8',
      });
      expect((JSON.parse(audit.stdout) as { steps: unknown[] }).steps).toHaveLength(5);
    } finally {
      await client.close();
    }
    // the client went away: the sandbox the server made went with it
    for (let i = 0; i < 100; i++) {
      const left = spawnSync('node', [CLI, 'ps', '--json'], { env, encoding: 'utf8' }).stdout;
      if (left === '{"sandboxes":[]}\n') return;
      await new Promise((done) => setTimeout(done, 100));
    }
    throw new Error('the MCP server left its sandbox behind');
  });
});
