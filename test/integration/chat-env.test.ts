import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHAT_TOOLS, ChatEnv, SandboxEnv, TaskEnv, loadTasks, type Task } from '../../src/env/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

const HELLO =
  '<tool_call>{"name": "exec", "arguments": {"command": "echo hello sandgym > /app/hello.txt"}}</tool_call>';
const SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>';

/** The chat-level env on an embedded platform: real sandboxes, a real task graded on submit. */
describe('the chat env', () => {
  let env: TestPlatform;
  let task: Task;

  beforeAll(async () => {
    env = await createTestPlatform('chat-env');
    [task] = (await loadTasks([join(resolve('examples/tasks'), 'hello-file')])) as [Task];
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it("opens with the system prompt, the task's instruction and the agent's tools; one answer's calls run in order", async () => {
    await using chat = ChatEnv.create(TaskEnv.create(env.platform, task), { systemPrompt: 'Be brief.' });
    const { observation, info } = await chat.reset();
    expect(observation).toEqual([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: task.instruction },
    ]);
    expect(info.tools).toBe(CHAT_TOOLS);
    expect(info.tools.map((t) => t.function.name)).toEqual([
      'exec',
      'write_file',
      'read_file',
      'list_dir',
      'submit',
    ]);
    const turn = await chat.step(`I will write it, then submit.\n${HELLO}\n${SUBMIT}`);
    expect(turn.observation).toEqual([
      { role: 'tool', tool_call_id: 'call_0_0', name: 'exec', content: '[exit code 0]' },
      { role: 'tool', tool_call_id: 'call_0_1', name: 'submit', content: 'submitted' },
    ]);
    expect([turn.reward, turn.terminated, turn.truncated, turn.outcome]).toEqual([
      1,
      true,
      false,
      { kind: 'ok' },
    ]);
    expect(turn.info.calls).toEqual([
      { id: 'call_0_0', name: 'exec', stepIndex: 0 },
      { id: 'call_0_1', name: 'submit', stepIndex: 1 },
    ]);
    expect(turn.info.grade?.reward).toBe(1);
    await expect(chat.step(SUBMIT)).rejects.toThrow(/The episode ended: call reset\(\)/);
  });

  it("keeps the model's own call ids, and tells calls after the episode's end that they did not run", async () => {
    await using chat = ChatEnv.create(
      SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } }),
      {
        instruction: 'Look around.',
      },
    );
    const { observation } = await chat.reset();
    expect(observation[1]).toEqual({ role: 'user', content: 'Look around.' });
    const call = (id: string, name: string, args: object) => ({
      id,
      type: 'function',
      function: { name, arguments: JSON.stringify(args) },
    });
    const turn = await chat.step({
      role: 'assistant',
      content: null,
      tool_calls: [
        call('w-1', 'write_file', { path: '/tmp/note', content: 'kept\n' }),
        call('r-2', 'read_file', { path: '/tmp/note' }),
        call('s-3', 'submit', {}),
        call('x-4', 'exec', { command: 'touch /tmp/late' }),
      ],
    });
    expect(turn.observation.map((m) => [m.role, 'tool_call_id' in m && m.tool_call_id, m.content])).toEqual([
      ['tool', 'w-1', 'wrote /tmp/note'],
      ['tool', 'r-2', 'kept\n'],
      ['tool', 's-3', 'submitted'],
      ['tool', 'x-4', 'Not run: the episode ended with an earlier call of this turn.'],
    ]);
    expect(turn.terminated).toBe(true);
    expect(turn.info.calls.map((c) => c.stepIndex)).toEqual([0, 1, 2, undefined]);
  });

  it('truncates at its turn budget and grades the episode as it stands', async () => {
    await using chat = ChatEnv.create(TaskEnv.create(env.platform, task), { maxTurns: 2 });
    await chat.reset();
    const first = await chat.step(HELLO);
    expect([first.terminated, first.truncated, first.info.turns]).toEqual([false, false, 1]);
    const second = await chat.step('Done, I think.');
    expect(second.observation).toEqual([
      { role: 'user', content: expect.stringMatching(/^No tool call found/) as unknown },
    ]);
    expect([second.truncated, second.terminated, second.info.truncatedBy]).toEqual([
      true,
      false,
      'turn_limit',
    ]);
    expect([second.reward, second.info.grade?.reward]).toEqual([1, 1]);
  });

  it("truncates at its token budget, counted by the caller's tokenizer or given per step", async () => {
    const words = (text: string) => text.split(/\s+/).filter(Boolean).length;
    const sandbox = () => SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } });
    await using counted = ChatEnv.create(sandbox(), { maxTokens: 20, countTokens: words });
    await counted.reset();
    const echo = (text: string) => `{"name": "exec", "parameters": {"command": "echo ${text}"}}`;
    const first = await counted.step(echo('one two'));
    // the answer's 7 words and the output's 5 ("one two", "[exit code 0]")
    expect([first.info.tokens, first.truncated]).toEqual([12, false]);
    const second = await counted.step(echo('three'));
    expect([second.info.tokens, second.truncated, second.info.truncatedBy]).toEqual([
      22,
      true,
      'token_limit',
    ]);
    // a sandbox env has no grader: the cut episode scores what its steps did
    expect(second.reward).toBe(0);
    await using given = ChatEnv.create(sandbox(), { maxTokens: 100 });
    await given.reset();
    expect((await given.step(echo('a'), { tokens: 60 })).truncated).toBe(false);
    expect((await given.step(echo('b'), { tokens: 40 })).info).toMatchObject({
      tokens: 100,
      truncatedBy: 'token_limit',
    });
  });

  it('goes on with an episode in another env from a disk checkpoint, its turns counting on', async () => {
    const first = TaskEnv.create(env.platform, task);
    await using chat = ChatEnv.create(first, { maxTurns: 2 });
    await chat.reset();
    const draft =
      '<tool_call>{"name": "exec", "arguments": {"command": "echo draft > /app/hello.txt"}}</tool_call>';
    await chat.step(draft);
    const saved = await first.checkpoint({ depth: 'disk' });
    const forkTask = TaskEnv.create(env.platform, task);
    await using fork = ChatEnv.create(forkTask, { maxTurns: 2 });
    const resumed = fork.resume(await forkTask.restore(saved, { episodeId: 'chat-fork-1' }), chat.progress);
    expect(resumed.observation[1]).toEqual({ role: 'user', content: task.instruction });
    expect([resumed.info.turns, resumed.info.episodeId]).toEqual([1, 'chat-fork-1']);
    const read = await fork.step(
      '<tool_call>{"name": "read_file", "arguments": {"path": "/app/hello.txt"}}</tool_call>',
    );
    expect(read.observation[0]!.content).toBe('draft\n');
    // the fork's second turn is the episode's second: the budget of 2 truncates it, graded 0
    expect([read.truncated, read.info.truncatedBy, read.reward]).toEqual([true, 'turn_limit', 0]);
  });

  it('refuses options it cannot honour, naming them', () => {
    const inner = SandboxEnv.create(env.platform);
    expect(() => ChatEnv.create(inner, { maxTurns: 0 })).toThrow(/ChatEnv options: maxTurns/);
    expect(() => ChatEnv.create(inner, { parser: 'mistral' as 'auto' })).toThrow(/ChatEnv options: format/);
  });
});
