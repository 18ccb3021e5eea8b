import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ChatEnv, MAX_ANSWER_CHARS, SandboxEnv, type AssistantMessage } from '../../src/env/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

/** Answers a model may give a chat env: each is read, bounded, and told back as an observation. */
const HOSTILE_ANSWERS: [string, string | AssistantMessage, RegExp][] = [
  ['a huge answer', `<tool_call>${'x'.repeat(MAX_ANSWER_CHARS + 1)}`, /over the 4194304 read: nothing ran/],
  [
    'nested JSON without end',
    `<tool_call>{"name":"exec","arguments":${'{"a":'.repeat(200_000)}1${'}'.repeat(200_000)}}</tool_call>`,
    /deeper than 64 levels/,
  ],
  [
    'thousands of calls',
    '<tool_call>{"name":"exec","arguments":{"command":"id"}}</tool_call>'.repeat(5000),
    /none ran/,
  ],
  [
    'thousands of structured calls',
    {
      tool_calls: Array.from({ length: 5000 }, (_, i) => ({
        id: `c${i}`,
        function: { name: 'exec', arguments: '{}' },
      })),
    },
    /5000 tool calls/,
  ],
  [
    'a tool that does not exist',
    '<tool_call>{"name":"shutdown_host","arguments":{}}</tool_call>',
    /no tool "shutdown_host"/,
  ],
  [
    'arguments of the wrong type',
    '<tool_call>{"name":"exec","arguments":{"command":["", 7]}}</tool_call>',
    /command/,
  ],
  ['arguments that are no object', '{"name": "read_file", "parameters": "/etc/shadow"}', /not JSON/],
  ['malformed JSON', '<tool_call>{"name": "exec", "arguments": {"command": "ls"</tool_call>', /not JSON/],
  [
    'a path out of bounds',
    '<tool_call>{"name":"read_file","arguments":{"path":"../../etc/passwd"}}</tool_call>',
    /absolute/,
  ],
  [
    'no message at all',
    { tool_calls: 'run everything' } as unknown as AssistantMessage,
    /no assistant message/,
  ],
];

describe('a chat env under a hostile model', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('chat-env-hostile');
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  for (const [name, answer, told] of HOSTILE_ANSWERS)
    it(`tells the model what was wrong with ${name}, runs none of it, and goes on`, () =>
      attack('model', `chat env: ${name}`, async () => {
        await using chat = ChatEnv.create(
          SandboxEnv.create(env.platform, { sandbox: { environment: 'busybox:latest' } }),
        );
        await chat.reset();
        const turn = await chat.step(answer);
        const told_ = turn.observation.map((m) => m.content).join('\n');
        expect(told_).toMatch(told);
        // bounded, whatever came in: a few messages of a few KiB
        expect(told_.length).toBeLessThan(16 * 1024);
        expect(turn.info.calls.every((c) => c.stepIndex === undefined)).toBe(true);
        // the model's fault is scored, never the platform's: no infra_failure to hide behind
        expect([turn.outcome, turn.terminated, turn.truncated]).toEqual([{ kind: 'ok' }, false, false]);
        // the honest twin: the same episode's next call runs, as its first step
        const honest = await chat.step(
          '<tool_call>{"name":"exec","arguments":{"command":"echo still here"}}</tool_call>',
        );
        expect(honest.observation[0]?.content).toBe('still here\n[exit code 0]');
        expect(honest.info.calls[0]?.stepIndex).toBe(0);
      }));
});
