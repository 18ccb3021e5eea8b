import { spawn, spawnSync } from 'node:child_process';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { readFile, readdir } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backends/index.ts';
import { loadTasks } from '../../src/env/index.ts';
import { atifTrajectorySchema, evaluate, openAiAgent } from '../../src/rollout/index.ts';
import { createTestPlatform } from '../support/platform.ts';

const CLI = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');
const TASK = resolve('examples/tasks/hello-file');

interface ChatRequest {
  model: string;
  messages: { role: string; content?: string | null; tool_call_id?: string }[];
  tools: { function: { name: string } }[];
}

/**
 * A chat-completions endpoint that plays a model: it first makes a call the env refuses (wrong
 * arguments), then writes the answer, then submits. It answers from the conversation it is sent,
 * as a real endpoint must, and reports usage.
 */
function fakeModel(requests: ChatRequest[]): Server {
  const answer = (request: ChatRequest) => {
    const last = request.messages.at(-1);
    const calls = request.messages.filter((m) => m.role === 'tool').length;
    const call = (name: string, args: unknown) => ({
      content: null,
      tool_calls: [
        { id: `c${calls}`, type: 'function', function: { name, arguments: JSON.stringify(args) } },
      ],
    });
    if (last?.role === 'user') return call('exec', { cwd: 'relative' });
    if (last?.content?.startsWith('Invalid call'))
      return call('exec', { command: "printf 'hello sandgym\\n' > /app/hello.txt" });
    return { ...call('submit', {}), content: 'The file is written; submitting.' };
  };
  return createServer((req: IncomingMessage, res) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => {
      const request = JSON.parse(body) as ChatRequest;
      requests.push(request);
      res.setHeader('content-type', 'application/json');
      res.end(
        JSON.stringify({
          choices: [{ message: { role: 'assistant', ...answer(request) }, finish_reason: 'tool_calls' }],
          usage: { prompt_tokens: 100 + request.messages.length, completion_tokens: 9 },
        }),
      );
    });
  });
}

function runCli(args: string[], env: NodeJS.ProcessEnv): Promise<{ status: number | null; stderr: string }> {
  const child = spawn('node', args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  return new Promise((done) => child.once('exit', (status) => done({ status, stderr })));
}

describe('an agent on an OpenAI-compatible endpoint', () => {
  const requests: ChatRequest[] = [];
  const server = fakeModel(requests);
  let baseUrl = '';

  beforeAll(async () => {
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  });

  afterAll(() => new Promise<void>((done) => server.close(() => done())));

  it('solves a task through tool calls, with every decision’s tokens in the trajectory', async () => {
    requests.length = 0;
    await using env = await createTestPlatform('llm-agent');
    const tasks = await loadTasks([TASK]);
    const [report] = await evaluate(env.platform, tasks, openAiAgent({ model: 'fake-model', baseUrl }), {
      concurrency: 1,
    });
    expect(report?.outcome).toEqual({ kind: 'ok' });
    expect(report?.reward).toBe(1);
    const [first] = requests;
    expect(first?.model).toBe('fake-model');
    expect(first?.tools.map((t) => t.function.name)).toEqual([
      'exec',
      'write_file',
      'read_file',
      'list_dir',
      'submit',
    ]);
    expect(first?.messages.map((m) => m.role)).toEqual(['system', 'user']);
    expect(first?.messages[1]?.content).toMatch(/hello\.txt/);
    // the refused call was told why, and the command's result came back as its tool message
    const last = requests.at(-1)!;
    const refused = last.messages.find((m) => m.content?.startsWith('Invalid call'))?.content;
    expect(refused).toMatch(/command/);
    expect(refused).toMatch(/cwd: paths are absolute/);
    expect(last.messages.at(-1)).toMatchObject({ role: 'tool', content: '[exit code 0]' });
    const steps = report!.trajectory!;
    expect(steps.map((s) => s.action.type)).toEqual(['exec', 'submit']);
    // the first decision took two answers (the refused call, then the good one): both are counted
    expect(steps[0]?.usage).toEqual({ promptTokens: 102 + 104, completionTokens: 18 });
    expect(steps[1]?.agentMessage).toBe('The file is written; submitting.');
  });

  it('writes ATIF trajectories from `sandgym eval --agent openai:MODEL --atif DIR`', async () => {
    await using test = await createTestPlatform('llm-agent-cli', {
      privateStore: true,
      seed: ['debian:bookworm'],
    });
    const atif = join(test.dataDir, 'atif');
    // not spawnSync: the model answers from this process, whose event loop must keep running
    const run = await runCli(
      [
        ...[CLI, 'eval', TASK, '--agent', 'openai:fake-model', '--base-url', baseUrl, '--atif', atif],
        ...['--temperature', '0.25', '--max-tokens', '77', '--system-prompt', 'Be brief.'],
      ],
      {
        ...process.env,
        SANDGYM_DATA_DIR: test.dataDir,
      },
    );
    expect(run.status, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/1 ATIF trajectories written/);
    // the model settings reach every request, and the system prompt is the trajectory's first step
    expect(requests.at(-1)).toMatchObject({ temperature: 0.25, max_tokens: 77 });
    expect(requests.at(-1)?.messages[0]).toMatchObject({ role: 'system', content: 'Be brief.' });
    const file = (await readdir(atif)).find((name) => name.endsWith('.json'));
    const trajectory = atifTrajectorySchema.parse(JSON.parse(await readFile(join(atif, file!), 'utf8')));
    expect(trajectory.agent).toMatchObject({ name: 'openai:fake-model', model_name: 'fake-model' });
    // the refused call's answer is a step of its own, with the model's call id
    expect(trajectory.steps.map((s) => s.source)).toEqual(['system', 'user', 'agent', 'agent', 'agent']);
    expect(trajectory.steps[0]?.message).toBe('Be brief.');
    expect(trajectory.steps[2]?.tool_calls?.[0]).toMatchObject({
      tool_call_id: 'c0',
      arguments: { cwd: 'relative' },
    });
    expect(trajectory.steps[3]?.tool_calls?.[0]).toMatchObject({
      tool_call_id: 'c1',
      function_name: 'exec',
      arguments: { command: "printf 'hello sandgym\\n' > /app/hello.txt" },
    });
    expect(trajectory.steps[3]?.observation?.results[0]?.content).toBe('[exit code 0]');
    expect(trajectory.steps[3]?.metrics?.prompt_tokens).toBeGreaterThan(0);
    expect(trajectory.final_metrics).toMatchObject({ total_completion_tokens: 27, total_steps: 5 });
    expect(trajectory.extra).toMatchObject({ task: 'hello-file', reward: 1, outcome: { kind: 'ok' } });
  });

  it('names what to change when --base-url is missing', () => {
    const missing = spawnSync('node', [CLI, 'eval', TASK, '--agent', 'openai:m'], { encoding: 'utf8' });
    expect(missing.status).toBe(2);
    expect(missing.stderr).toMatch(/needs --base-url/);
  });

  it('refuses model settings out of range, or for an agent without a model', () => {
    const eval_ = (...args: string[]) =>
      spawnSync('node', [CLI, 'eval', TASK, ...args], { encoding: 'utf8' });
    const model = ['--agent', 'openai:m', '--base-url', baseUrl];
    expect(eval_(...model, '--temperature', '3').stderr).toMatch(
      /--temperature must be a number from 0 to 2/,
    );
    expect(eval_(...model, '--temperature', 'NaN').status).toBe(2);
    expect(eval_(...model, '--max-tokens', '0').stderr).toMatch(
      /--max-tokens must be a whole number from 1 to 1048576, got 0/,
    );
    const oracle = eval_('--agent', 'oracle', '--temperature', '0.5');
    expect(oracle.status).toBe(2);
    expect(oracle.stderr).toMatch(/--temperature is for --agent openai:MODEL/);
  });
});
