import { describe, expect, it } from 'vitest';
import { readAnswer } from '../../src/env/chat/parse-calls.ts';
import { MAX_ANSWER_CHARS, MAX_CALLS_PER_ANSWER, actionOfToolCall } from '../../src/env/index.ts';

/** The readers of a model's tool calls: every format, and answers no model should be able to crash. */
describe('reading tool calls out of an answer', () => {
  it('reads chat completions tool_calls, their ids and their JSON arguments', () => {
    const read = readAnswer(
      {
        role: 'assistant',
        content: 'thinking aloud <tool_call>{"name":"submit"}</tool_call>',
        tool_calls: [
          { id: 'call_a', type: 'function', function: { name: 'exec', arguments: '{"command":"ls"}' } },
          { id: 'call_b', type: 'function', function: { name: 'submit', arguments: '' } },
        ],
      },
      'auto',
    );
    // the structured calls are the answer's: the text beside them is not read for more
    expect(read).toEqual({
      calls: [
        { id: 'call_a', name: 'exec', args: { command: 'ls' } },
        { id: 'call_b', name: 'submit', args: {} },
      ],
    });
  });

  it('reads Hermes/Qwen blocks, skipping what the model only thought, and one left open', () => {
    const text =
      '<think>maybe <tool_call>{"name":"exec","arguments":{"command":"rm -rf /"}}</tool_call></think>' +
      'I will look.\n<tool_call>\n{"name": "exec", "arguments": {"command": "ls /app"}}\n</tool_call>\n' +
      '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"/app/a\\"}"}';
    expect(readAnswer(text, 'auto').calls).toEqual([
      { name: 'exec', args: { command: 'ls /app' } },
      { name: 'read_file', args: { path: '/app/a' } },
    ]);
    expect(readAnswer(text, 'hermes').calls).toHaveLength(2);
  });

  it("reads Llama 3's JSON: one call, a list, or calls separated by semicolons", () => {
    const one = '<|python_tag|>{"name": "list_dir", "parameters": {"path": "/app"}}';
    expect(readAnswer(one, 'auto').calls).toEqual([{ name: 'list_dir', args: { path: '/app' } }]);
    const several =
      '{"name": "exec", "parameters": {"command": "a;b"}}; {"name": "submit", "parameters": {}}';
    expect(readAnswer(several, 'llama3').calls.map((c) => c.name)).toEqual(['exec', 'submit']);
    expect(readAnswer('[{"name": "submit", "parameters": {}}]', 'auto').calls).toEqual([
      { name: 'submit', args: {} },
    ]);
    // prose is no call in either format
    expect(readAnswer('The file {is} done.', 'auto')).toEqual({ calls: [] });
  });

  it("takes the caller's parser, and its failure as the model's observation", () => {
    const pythonic = (text: string) =>
      [...text.matchAll(/CALL (\w+) (\S+)/g)].map((m) => ({ name: m[1], arguments: m[2] }));
    expect(readAnswer('CALL exec {"command":"id"}', pythonic).calls).toEqual([
      { name: 'exec', args: { command: 'id' } },
    ]);
    const failing = () => {
      throw new Error('unbalanced parenthesis');
    };
    expect(readAnswer('x', failing)).toEqual({
      calls: [],
      problem: 'the tool calls could not be read: unbalanced parenthesis',
    });
  });

  it('answers hostile text with bounded problems, never a throw', () => {
    const deep = `<tool_call>{"name":"exec","arguments":${'['.repeat(500_000)}</tool_call>`;
    expect(readAnswer(deep, 'auto').calls[0]).toMatchObject({
      problem: expect.stringMatching(/deeper than 64/) as unknown,
    });
    const deepLlama = `{"name":"exec","parameters":${'{"a":'.repeat(100_000)}`;
    expect(readAnswer(deepLlama, 'auto').problem).toMatch(/deeper than 64/);
    const many = '<tool_call>{"name":"submit"}</tool_call>'.repeat(10_000);
    expect(readAnswer(many, 'auto')).toEqual({
      calls: [],
      problem: `the answer makes more than ${MAX_CALLS_PER_ANSWER} tool calls, more than the ${MAX_CALLS_PER_ANSWER} one turn may: none ran`,
    });
    const manyStructured = Array.from({ length: 5000 }, () => ({
      function: { name: 'submit', arguments: '{}' },
    }));
    expect(readAnswer({ tool_calls: manyStructured }, 'auto').problem).toMatch(/5000 tool calls/);
    expect(readAnswer('x'.repeat(MAX_ANSWER_CHARS + 1), 'auto').problem).toMatch(/over the 4194304 read/);
    expect(
      readAnswer('<tool_call>{"name": "exec", "arguments": {"command": </tool_call>', 'auto').calls,
    ).toEqual([{ problem: expect.stringMatching(/^the tool call is not JSON: /) as unknown }]);
    expect(readAnswer('<tool_call>[1, 2]</tool_call>', 'auto').calls[0]).toMatchObject({
      problem: expect.stringMatching(/JSON object/) as unknown,
    });
    expect(
      readAnswer({ tool_calls: [42, { function: { name: 'exec', arguments: 'null' } }] }, 'auto').calls,
    ).toEqual([
      { problem: expect.stringMatching(/is not \{"id", "function"/) as unknown },
      { name: 'exec', problem: 'the arguments must be a JSON object, not null' },
    ]);
    expect(readAnswer('{"name": 7}', 'auto').calls).toEqual([
      { problem: expect.stringMatching(/"name", a string/) as unknown },
    ]);
    expect(readAnswer('{"a": 1}} trailing', 'auto').problem).toMatch(/unmatched "}"/);
  });

  it('turns calls into actions, or says why not: a missing tool, a wrong type, a type smuggled in', () => {
    expect(actionOfToolCall('exec', { command: 'ls', timeout_ms: 5000 })).toEqual({
      type: 'exec',
      command: 'ls',
      timeoutMs: 5000,
    });
    expect(actionOfToolCall('rm_rf', {})).toEqual({
      error: 'there is no tool "rm_rf"; the tools are exec, write_file, read_file, list_dir, submit',
    });
    expect(actionOfToolCall('exec', { command: 42 })).toMatchObject({
      error: expect.stringMatching(/command/) as unknown,
    });
    // the tool names the action: arguments cannot turn a read into a command
    expect(actionOfToolCall('read_file', { type: 'exec', command: 'id', path: '/etc/hostname' })).toEqual({
      type: 'read_file',
      path: '/etc/hostname',
    });
    const noisy = Object.fromEntries(Array.from({ length: 50_000 }, (_, i) => [`k${i}`, 1]));
    const refused = actionOfToolCall('exec', { command: 'ls', env: noisy });
    expect('error' in refused && refused.error.length).toBeLessThanOrEqual(2049);
  });
});
