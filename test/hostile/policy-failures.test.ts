import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, readFile, readdir, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backends/index.ts';
import {
  SandboxEnv,
  VectorEnv,
  loadTasks,
  type SandboxAction,
  type SandboxObservation,
  type StepResult,
  type Task,
} from '../../src/env/index.ts';
import { Platform } from '../../src/platform/index.ts';
import { ENVS, SANDBOXES, WireClient } from '../../src/platform/wire/index.ts';
import { secretRedactor } from '../../src/common/index.ts';
import {
  EvalJournal,
  evaluate,
  nopAgent,
  openAiAgent,
  scriptedAgent,
  type Agent,
  type EpisodeReport,
} from '../../src/rollout/index.ts';
import { PYTHON } from '../../benchmarks/python-client.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT, createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const CLI = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');
const OJ_TASK = resolve('examples/tasks/oj-reverse-words.oj.json');
const BUSYBOX = { sandbox: { environment: 'busybox:latest' } } as const;
const MIB = 1024 * 1024;

/** The operator's key: with characters that URL-encoding and base64 both change. */
const API_KEY = `sk-proj/${randomBytes(12).toString('hex')}+Zq=${randomBytes(6).toString('base64url')}`;
/** The key as a leaky endpoint might echo it: as is, URL-encoded, base64'd. */
const KEY_FORMS = [
  API_KEY,
  encodeURIComponent(API_KEY),
  Buffer.from(API_KEY).toString('base64'),
  Buffer.from(API_KEY).toString('base64url'),
];

function expectNoKey(text: string, where: string): void {
  for (const form of KEY_FORMS)
    expect(text.includes(form), `${where} holds the API key (${form})`).toBe(false);
}

/** The key as a model may hand it back escaped: JSON's `\/`, every character `\uXXXX`, mixed. */
const ESCAPED_KEYS = [
  API_KEY.replaceAll('/', '\\/'),
  [...API_KEY].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join(''),
  [...API_KEY].map((c, i) => (i % 2 ? c : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)).join(''),
];

/** No form of the key, whole, escaped or in pieces (any 10 of its characters in a row, decoded or not). */
function expectNoKeyPiece(text: string, where: string): void {
  expectNoKey(text, where);
  const decoded = text
    .replace(/\\+u([0-9a-fA-F]{4})/g, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)))
    .replace(/\\+\//g, '/');
  for (let start = 0; start + 10 <= API_KEY.length; start++) {
    const piece = API_KEY.slice(start, start + 10);
    expect(decoded.includes(piece), `${where} holds a piece of the API key (${piece})`).toBe(false);
  }
}

/** Every file below `dir`, for a search of secrets in what an eval left. */
async function filesBelow(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
  const files: string[] = [];
  for (const entry of entries) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) files.push(...(await filesBelow(path)));
    else if (entry.isFile()) files.push(path);
  }
  return files;
}

// ---------------------------------------------------------------------------------------------
// A model endpoint on 127.0.0.1 that plays a hostile (or honest) model; `model` picks how.
// ---------------------------------------------------------------------------------------------

interface ChatRequest {
  model: string;
  messages: { role: string; content?: string | null; tool_call_id?: string }[];
}

/** What the last huge answer managed to send before the agent hung up. */
const sent = { hugeBytes: 0, hugeTotal: 400 * MIB, largestRequest: 0 };

function toolCall(name: string, args: unknown, id = 'c1') {
  return { id, type: 'function', function: { name, arguments: JSON.stringify(args) } };
}

function completion(
  message: Record<string, unknown>,
  usage: unknown = { prompt_tokens: 10, completion_tokens: 5 },
) {
  return JSON.stringify({
    choices: [{ message: { role: 'assistant', content: null, ...message }, finish_reason: 'tool_calls' }],
    usage,
  });
}

const OJ_SOLUTION = (JSON.parse(await readFile(OJ_TASK, 'utf8')) as { solution: string }).solution;

/** The honest model on the OJ task: writes the reference program, then submits. */
function honest(request: ChatRequest): string {
  const answered = request.messages.some((m) => m.role === 'tool');
  return answered
    ? completion({ tool_calls: [toolCall('submit', {}, 'c2')], content: 'Submitting.' })
    : completion({
        tool_calls: [toolCall('write_file', { path: '/work/solution.sh', content: OJ_SOLUTION })],
      });
}

function json(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(body);
}

/** Writes `chunk` until `total` bytes went out or the client went away, honouring backpressure. */
async function flood(res: ServerResponse, chunk: Buffer, total: number): Promise<number> {
  let written = 0;
  let closed = false;
  res.once('close', () => (closed = true));
  while (!closed && written < total) {
    written += chunk.length;
    if (!res.write(chunk)) await new Promise((done) => res.once('drain', done).once('close', done));
  }
  res.end();
  return written;
}

/** `prompt_tokens` as a lying endpoint reports it, raw JSON text. */
const BAD_USAGE = {
  negative: '-5',
  fraction: '1.5',
  huge: '1e15',
  string: '"many"',
  infinite: '1e999',
  nan: 'NaN',
};

const KEY_ECHO = `Incorrect API key provided: ${API_KEY}. Sent as Bearer%20${encodeURIComponent(API_KEY)}, basic ${Buffer.from(API_KEY).toString('base64')}`;

/** Hostile and honest behaviours, by model name. */
const SCENARIOS: Record<string, (request: ChatRequest, res: ServerResponse, raw: string) => void> = {
  honest: (request, res) => json(res, 200, honest(request)),
  // 400 MB of one string: an agent that reads it whole needs gigabytes
  huge: (_request, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"choices":[{"message":{"content":"');
    void flood(res, Buffer.alloc(MIB, 'a'), sent.hugeTotal).then((bytes) => (sent.hugeBytes = bytes));
  },
  'huge-declared': (_request, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(sent.hugeTotal) });
    void flood(res, Buffer.alloc(MIB, ' '), sent.hugeTotal);
  },
  // a byte at a time, for ever
  drip: (_request, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    const timer = setInterval(() => res.write(' '), 50);
    res.once('close', () => clearInterval(timer));
  },
  truncated: (_request, res) =>
    json(res, 200, completion({ tool_calls: [toolCall('submit', {})] }).slice(0, 60)),
  'not-json': (_request, res) => json(res, 200, '<html>502 Bad Gateway</html>'),
  'no-choices': (_request, res) => json(res, 200, JSON.stringify({ choices: [] })),
  'wrong-shape': (_request, res) => json(res, 200, JSON.stringify({ choices: [{ message: 'hi' }] })),
  // 20 MiB of one tool call's arguments
  'giant-arguments': (_request, res) =>
    json(
      res,
      200,
      completion({
        tool_calls: [toolCall('write_file', { path: '/work/solution.sh', content: 'x'.repeat(20 * MIB) })],
      }),
    ),
  'many-calls': (_request, res) =>
    json(
      res,
      200,
      completion({ tool_calls: Array.from({ length: 10_000 }, (_, i) => toolCall('submit', {}, `c${i}`)) }),
    ),
  // usage the endpoint makes up: negative, fractional, huge, a string, infinite, NaN
  ...Object.fromEntries(
    Object.entries(BAD_USAGE).map(([name, tokens]) => [
      `usage-${name}`,
      (request: ChatRequest, res: ServerResponse) =>
        json(
          res,
          200,
          honest(request).replace(
            /"usage":\{[^}]*\}/,
            `"usage":{"prompt_tokens":${tokens},"completion_tokens":3}`,
          ),
        ),
    ]),
  ),
  'status-401': (_request, res) => json(res, 401, JSON.stringify({ error: { message: KEY_ECHO } })),
  'status-403': (_request, res) => json(res, 403, `Forbidden for ${KEY_ECHO}`, { 'x-echo': 'yes' }),
  'status-429': (_request, res) =>
    json(res, 429, JSON.stringify({ error: { message: `Slow down, ${KEY_ECHO}` } })),
  'status-500': (_request, res) =>
    json(res, 500, JSON.stringify({ error: { message: `Crashed on ${KEY_ECHO}` } })),
  // a 400 that echoes the request with its headers, as some proxies do
  'status-400-echo': (_request, res, raw) =>
    json(res, 400, `Bad request: Authorization: Bearer ${API_KEY}\n${raw.slice(0, 4096)}`),
  // a completion that hands the key back as the model's words and in its tool call
  'echo-key': (request, res) =>
    request.messages.some((m) => m.role === 'tool')
      ? json(
          res,
          200,
          completion({ tool_calls: [toolCall('submit', {}, 'c2')], content: `my key is ${API_KEY}` }),
        )
      : json(
          res,
          200,
          completion({
            content: `I was given ${KEY_FORMS.join(' and ')}`,
            tool_calls: [toolCall('exec', { command: `echo ${KEY_FORMS.join(' ')} > /tmp/key` })],
          }),
        ),
  // answers the first task, never answers the one that names "task b" (for the journal tests)
  journal: (request, res) => {
    if (request.messages.some((m) => m.content?.includes('(task b)'))) return; // never answers
    json(res, 200, honest(request));
  },
  'journal-other': (_request, res) => json(res, 200, completion({ tool_calls: [toolCall('submit', {})] })),
  // pieces the key together in the sandbox (each piece too short to be the key), and says it escaped
  'piece-key': (request, res) => {
    const turn = request.messages.filter((m) => m.role === 'tool').length;
    const pieces = API_KEY.match(/.{1,4}/g)!
      .map((piece) => `'${piece}'`)
      .join(' ');
    const calls = [
      toolCall('exec', { command: `printf '%s' ${pieces}; echo; printf '%s' ${pieces} | base64` }, 'p0'),
      toolCall('exec', { command: `env; cat /proc/1/environ` }, 'p1'),
      toolCall('submit', {}, 'p2'),
    ];
    json(
      res,
      200,
      completion({
        content: `my key: ${ESCAPED_KEYS.join(' or ')}`,
        tool_calls: [calls[Math.min(turn, calls.length - 1)]],
      }),
    );
  },
  // 2 MiB of output a turn, for 12 turns: the conversation must not grow with them
  chatty: (request, res) => {
    const turn = request.messages.filter((m) => m.role === 'tool').length;
    const noisy = `head -c 1048576 /dev/zero | tr '\\0' a; head -c 1048576 /dev/zero | tr '\\0' b >&2`;
    const call =
      turn < 12
        ? toolCall('exec', { command: noisy }, `n${turn}`)
        : turn === 12
          ? toolCall('write_file', { path: '/work/solution.sh', content: OJ_SOLUTION }, 'w')
          : toolCall('submit', {}, 's');
    json(res, 200, completion({ content: 'x'.repeat(300 * 1024), tool_calls: [call] }));
  },
};

/**
 * A model whose first tool call's arguments are `raw` (JSON that is no object, or no JSON), then
 * honest; its endpoint, like vLLM's, fails (500) on a request whose conversation holds a call with
 * arguments that are not a JSON object, or hold text UTF-8 cannot encode.
 */
function oddArguments(raw: string) {
  return (request: ChatRequest, res: ServerResponse): void => {
    const calls = request.messages.flatMap(
      (m) => (m as { tool_calls?: { function: { arguments: string } }[] }).tool_calls ?? [],
    );
    const objects = calls.every((call) => {
      try {
        const args = JSON.parse(call.function.arguments) as unknown;
        // a lone surrogate cannot be encoded as UTF-8 to render the template: Python servers fail
        const encodable = !/\\ud[89a-f][0-9a-f]{2}/i.test(JSON.stringify(args));
        return !!args && typeof args === 'object' && !Array.isArray(args) && encodable;
      } catch {
        return false;
      }
    });
    if (!objects)
      return json(res, 500, JSON.stringify({ error: { message: 'cannot render the chat template' } }));
    const turn = request.messages.filter((m) => m.role === 'tool').length;
    if (turn === 0)
      return json(
        res,
        200,
        completion({
          tool_calls: [{ id: 'a0', type: 'function', function: { name: 'exec', arguments: raw } }],
        }),
      );
    json(
      res,
      200,
      completion({
        tool_calls: [
          turn === 1
            ? toolCall('write_file', { path: '/work/solution.sh', content: OJ_SOLUTION }, 'a1')
            : toolCall('submit', {}, 'a2'),
        ],
      }),
    );
  };
}

/** Every kind of arguments text that parses to no object, or does not parse. */
const ODD_ARGUMENTS: Record<string, string> = {
  null: 'null',
  number: '42',
  array: '["ls"]',
  string: '"ls -la"',
  true: 'true',
  'broken JSON': '{"command": "ls',
  'lone surrogate': '{"command": "echo \\ud800"}',
};
for (const [name, raw] of Object.entries(ODD_ARGUMENTS)) SCENARIOS[`args-${name}`] = oddArguments(raw);

function fakeModel(scenarios: typeof SCENARIOS = SCENARIOS): Server {
  return createServer((req: IncomingMessage, res) => {
    let raw = '';
    req.on('data', (chunk: Buffer) => (raw += chunk.toString()));
    req.on('end', () => {
      sent.largestRequest = Math.max(sent.largestRequest, raw.length);
      const request = JSON.parse(raw) as ChatRequest;
      // headers are part of what a leaky proxy echoes
      const echoed = `${raw}\nauthorization: ${req.headers.authorization ?? ''}`;
      (scenarios[request.model] ?? scenarios['honest']!)(request, res, echoed);
    });
  });
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
}

// ---------------------------------------------------------------------------------------------

/** Every way an action can be invalid, with what its observation must say. */
function invalidActions(): [string, unknown, RegExp][] {
  const circular: Record<string, unknown> = { type: 'exec', command: 'ls' };
  circular['env'] = { self: circular };
  let nested: unknown = 'ls';
  for (let i = 0; i < 10_000; i++) nested = { a: nested };
  const throwing = { type: 'exec' } as Record<string, unknown>;
  Object.defineProperty(throwing, 'command', {
    enumerable: true,
    get() {
      throw new Error('a getter that throws');
    },
  });
  return [
    ['missing field', { type: 'exec' }, /command/],
    ['wrong type', { type: 'exec', command: 42 }, /command/],
    ['unknown type', { type: 'rm_rf', path: '/' }, /type/],
    ['no type', { command: 'ls' }, /type/],
    ['a string', 'ls -la', /object/],
    ['null', null, /object/],
    ['an array', [{ type: 'submit' }], /object/],
    ['relative path', { type: 'read_file', path: 'etc/passwd' }, /absolute/],
    ['empty path', { type: 'list_dir', path: '' }, /absolute/],
    ['NUL in a path', { type: 'write_file', path: '/tmp/a\0b', content: 'x' }, /NUL/],
    ['.. in a path', { type: 'read_file', path: '/tmp/../etc/shadow' }, /\.\./],
    ['relative cwd', { type: 'exec', command: 'ls', cwd: 'tmp' }, /absolute/],
    ['NUL in an env value', { type: 'exec', command: 'env', env: { A: 'x\0y' } }, /NUL/],
    ['= in an env name', { type: 'exec', command: 'env', env: { 'A=B': 'x' } }, /=/],
    ['empty env name', { type: 'exec', command: 'env', env: { '': 'x' } }, /name/],
    ['NUL in an env name', { type: 'exec', command: 'env', env: { 'A\0B': 'x' } }, /NUL|name/],
    ['NUL in an argument', { type: 'exec', command: ['echo', 'a\0b'] }, /NUL/],
    ['empty argv', { type: 'exec', command: [] }, /command/],
    ['negative timeout', { type: 'exec', command: 'ls', timeoutMs: -1 }, /timeoutMs/],
    ['fractional timeout', { type: 'exec', command: 'ls', timeoutMs: 1.5 }, /timeoutMs/],
    ['NaN timeout', { type: 'exec', command: 'ls', timeoutMs: Number.NaN }, /timeoutMs/],
    ['infinite timeout', { type: 'exec', command: 'ls', timeoutMs: Number.POSITIVE_INFINITY }, /timeoutMs/],
    ['absurd timeout', { type: 'exec', command: 'ls', timeoutMs: 1e300 }, /timeoutMs/],
    ['string timeout', { type: 'exec', command: 'ls', timeoutMs: '100' }, /timeoutMs/],
    ['bigint timeout', { type: 'exec', command: 'ls', timeoutMs: 10n }, /timeoutMs/],
    ['session with a space', { type: 'exec', command: 'ls', session: 'a b' }, /session/],
    ['session with a path', { type: 'exec', command: 'ls', session: '../../etc' }, /session/],
    ['session too long', { type: 'exec', command: 'ls', session: 's'.repeat(65) }, /session/],
    // past the in-sandbox agent's 80 MiB frame: today it ends the sandbox (agent_crash)
    ['huge file', { type: 'write_file', path: '/tmp/big', content: 'x'.repeat(90 * MIB) }, /bytes/],
    ['huge command', { type: 'exec', command: 'x'.repeat(40 * MIB) }, /bytes/],
    ['huge type', { type: 't'.repeat(8 * MIB) }, /type/],
    ['nested junk', { type: 'exec', command: nested }, /command/],
    ['circular', circular, /env/],
    ['a function', { type: 'exec', command: () => 'ls' }, /command/],
    ['a getter that throws', throwing, /cannot be read|getter/],
  ];
}

/** That a step of an invalid action was an observation, scored, and the episode goes on. */
function expectInvalidStep(result: StepResult<unknown>, message: RegExp): void {
  expect(result.outcome).toEqual({ kind: 'ok' });
  expect(result.terminated).toBe(false);
  expect(result.truncated).toBe(false);
  expect(result.reward).toBe(0);
  expect(result.observation).toMatchObject({ type: 'error', code: 'invalid_action' });
  const text = (result.observation as { message: string }).message;
  expect(text).toMatch(message);
  // the message is the validation's, never the junk echoed back whole
  expect(text.length).toBeLessThan(8192);
}

describe('a policy cannot mask its own failures', () => {
  let test: TestPlatform;
  const model = fakeModel();
  let baseUrl = '';
  let tasks: Task[] = [];

  beforeAll(async () => {
    test = await createTestPlatform('policy-failures');
    baseUrl = await listen(model);
    tasks = await loadTasks([OJ_TASK]);
  });

  afterAll(async () => {
    model.closeAllConnections();
    await new Promise((done) => model.close(done));
    await test?.[Symbol.asyncDispose]();
  });

  describe('invalid actions are observations of logged, scored steps', () => {
    it('through SandboxEnv.step: every way an action can be invalid, and each replays exactly once', async () => {
      await using gym = SandboxEnv.create(test.platform, BUSYBOX);
      await gym.reset();
      const variations = invalidActions();
      const seen: SandboxObservation[] = [];
      for (const [name, junk, message] of variations)
        await attack('policy', `SandboxEnv.step: ${name}`, async () => {
          const result = await gym.step(junk as SandboxAction);
          expectInvalidStep(result, message);
          seen.push(result.observation);
        });
      // the honest twin: a valid action still runs, at the next index
      const ran = await gym.step({ type: 'exec', command: ['echo', 'still here'] });
      expect(ran.observation).toMatchObject({ type: 'exec', stdout: 'still here\n', exitCode: 0 });
      expect(ran.info.stepIndex).toBe(variations.length);

      await attack('policy', 'invalid actions replay exactly once from the log', async () => {
        const sandbox = gym.current!;
        const records = await (await test.platform.stepLog(sandbox.id)).records();
        const mine = records.filter((r) => r.episodeId === gym.episode);
        expect(mine).toHaveLength(variations.length + 1);
        for (const record of mine.slice(0, -1)) {
          expect(record.action).toMatchObject({ type: 'invalid' });
          // what the log keeps of the junk is bounded, whatever was given
          expect(JSON.stringify(record.action).length).toBeLessThan(512 * 1024);
        }
        // another client attaches and re-issues the same junk: same observations, nothing runs
        const again = await SandboxEnv.attach(test.platform, sandbox, gym.episode);
        for (const [index, [, junk]] of variations.entries()) {
          const replayed = await again.step(junk as SandboxAction);
          expect(replayed.info.replayed).toBe(true);
          expect(replayed.observation).toEqual(seen[index]);
        }
        // a different action at a logged index is still a divergence
        await expect(again.step({ type: 'exec', command: 'id' })).rejects.toMatchObject({
          code: 'divergence',
        });
      });
    });

    it('through VectorEnv: a junk action beside a valid one', () =>
      attack('policy', 'VectorEnv.step with a junk action', async () => {
        await using vector = VectorEnv.create(() => SandboxEnv.create(test.platform, BUSYBOX), 2, {
          autoreset: 'disabled',
        });
        await vector.reset();
        const { observations, outcomes, terminated } = await vector.step([
          { type: 'read_file', path: 'relative' },
          { type: 'exec', command: ['echo', 'ok'] },
        ]);
        expect(outcomes).toEqual([{ kind: 'ok' }, { kind: 'ok' }]);
        expect(terminated).toEqual([false, false]);
        expect(observations[0]).toMatchObject({ type: 'error', code: 'invalid_action' });
        expect(observations[1]).toMatchObject({ type: 'exec', stdout: 'ok\n' });
      }));

    it('through TaskEnv in a rollout: junk actions and junk answers are steps, the episode is graded', async () => {
      const junk = [
        { type: 'write_file', path: 'solution.sh', content: OJ_SOLUTION },
        { type: 'shell', command: 'rm -rf /' },
        false,
        'cat /work/solution.sh',
        42,
      ];
      await attack('policy', 'TaskEnv: junk actions before the right one', async () => {
        const [report] = await evaluate(
          test.platform,
          tasks,
          () =>
            scriptedAgent([
              ...(junk as SandboxAction[]),
              { type: 'write_file', path: '/work/solution.sh', content: OJ_SOLUTION },
            ]),
          { concurrency: 1 },
        );
        expect(report?.outcome).toEqual({ kind: 'ok' });
        expect(report?.reward).toBe(1);
        const steps = report!.trajectory!;
        expect(steps.map((s) => s.observation.type)).toEqual([
          ...junk.map(() => 'error'),
          'written',
          'submitted',
        ]);
        // the report and its trajectory are plain data
        expect(() => JSON.stringify(report)).not.toThrow();
      });
      await attack('policy', 'an agent that answers no action at all', async () => {
        const answers: unknown[] = [undefined, 'ls', { action: null }, { action: { type: 'nope' } }];
        const odd: Agent = (_observation, { stepIndex }) =>
          Promise.resolve(
            (stepIndex < answers.length ? answers[stepIndex] : { type: 'submit' }) as SandboxAction,
          );
        const [report] = await evaluate(test.platform, tasks, () => odd, { concurrency: 1 });
        expect(report?.outcome).toEqual({ kind: 'ok' });
        expect(report?.reward).toBe(0);
        expect(report!.trajectory!.slice(0, 4).map((s) => s.observation)).toEqual(
          answers.map((): unknown => expect.objectContaining({ type: 'error', code: 'invalid_action' })),
        );
      });
      await attack('policy', 'a decision with absurd token counts', async () => {
        for (const usage of [
          { promptTokens: -5, completionTokens: 1 },
          { promptTokens: 1e15, completionTokens: 1 },
          { promptTokens: 1.5, completionTokens: 1 },
          { promptTokens: Number.NaN, completionTokens: 1 },
          { promptTokens: 'many', completionTokens: 1 },
        ]) {
          const lying: Agent = () =>
            Promise.resolve({ action: { type: 'submit' }, usage } as unknown as SandboxAction);
          const [report] = await evaluate(test.platform, tasks, () => lying, { concurrency: 1 });
          // the agent's failure: scored 0, not masked, and the numbers are not in the report
          expect(report?.outcome).toEqual({ kind: 'ok' });
          expect(report?.reward).toBe(0);
          expect(report?.agentFailure).toMatch(/usage/);
          expect(report?.trajectory ?? []).toEqual([]);
        }
      });
      // the honest twin: a decision with sane usage is kept as given
      const fair: Agent = () =>
        Promise.resolve({ action: { type: 'submit' }, usage: { promptTokens: 12, completionTokens: 3 } });
      const [report] = await evaluate(test.platform, tasks, () => fair, { concurrency: 1 });
      expect(report?.trajectory?.[0]?.usage).toEqual({ promptTokens: 12, completionTokens: 3 });
    });

    it('through MCP tools: a junk argument is a logged step', () =>
      attack('policy', 'MCP exec with a relative cwd', async () => {
        await using cli = await createTestPlatform('policy-mcp', { privateStore: true });
        const env = { ...process.env, SANDGYM_DATA_DIR: cli.dataDir } as Record<string, string>;
        const client = new Client({ name: 'policy-test', version: '1.0.0' });
        await client.connect(
          new StdioClientTransport({
            command: 'node',
            args: [CLI, 'mcp', '--environment', 'busybox:latest'],
            env,
            stderr: 'pipe',
          }),
        );
        try {
          const bad = (await client.callTool({
            name: 'exec',
            arguments: { command: 'pwd', cwd: 'tmp' },
          })) as {
            content: { text: string }[];
            isError: boolean;
          };
          expect(bad.isError).toBe(true);
          expect(bad.content[0]?.text).toMatch(/^error invalid_action: .*cwd/);
          const good = (await client.callTool({ name: 'exec', arguments: { command: 'echo fine' } })) as {
            content: { text: string }[];
          };
          expect(good.content[0]?.text).toBe('fine\n[exit code 0]');
          const ps = JSON.parse(
            spawnSync('node', [CLI, 'ps', '--json'], { env, encoding: 'utf8' }).stdout,
          ) as {
            sandboxes: { id: string }[];
          };
          const audit = JSON.parse(
            spawnSync('node', [CLI, 'audit', ps.sandboxes[0]!.id, '--json'], { env, encoding: 'utf8' })
              .stdout,
          ) as { steps: unknown[] };
          // both calls are steps of the sandbox's trajectory log
          expect(audit.steps).toHaveLength(2);
        } finally {
          await client.close();
        }
      }));

    describe('over the wire', () => {
      const dataDir = join(TEST_DATA_ROOT, `policy-wire-${process.pid}`);
      let cluster: InProcessCluster;
      let address = '';
      const metadata = { 'sandgym-project': 'policy' };

      beforeAll(async () => {
        await mkdir(join(dataDir, 'tasks'), { recursive: true });
        cluster = await startInProcessCluster({
          dataDir,
          storeDir: STORE_DIR,
          nodeId: 'policy',
          grants: {},
          envs: { taskRoot: join(dataDir, 'tasks') },
        });
        address = `127.0.0.1:${cluster.node.port}`;
      });

      afterAll(async () => {
        await cluster?.close();
        await rm(dataDir, { recursive: true, force: true });
      });

      it('Sandboxes.Step: junk is a logged step, and a retry of its index answers the same', () =>
        attack('policy', 'wire Step with junk actions', async () => {
          const client = new WireClient(address, SANDBOXES, { token: IN_PROCESS_NODE_TOKEN, metadata });
          try {
            const { id } = await client.call('Create', { request: { environment: 'busybox:latest' } });
            try {
              const junk: unknown[] = [
                { type: 'exec', command: 'ls', timeoutMs: 1.5 },
                { type: 'read_file', path: 'relative' },
                'rm -rf /',
                { type: 'exec', command: 'env', env: { 'A=B': 'x' } },
                { type: 'list_dir', path: '/tmp', deeper: { nested: [1, { junk: true }] }, type2: 'x' },
              ];
              for (const [stepIndex, action] of junk.slice(0, 4).entries()) {
                const step = { sandboxId: id, episodeId: 'e1', stepIndex, action };
                const first = await client.call('Step', step);
                expect(first.result.outcome).toEqual({ kind: 'ok' });
                expect(first.result.observation).toMatchObject({ type: 'error', code: 'invalid_action' });
                const retried = await client.call('Step', step);
                expect(retried.replayed).toBe(true);
                expect(retried.result.observation).toEqual(first.result.observation);
              }
              // extra fields are dropped, not fatal: the honest twin runs
              const listed = await client.call('Step', {
                sandboxId: id,
                episodeId: 'e1',
                stepIndex: 4,
                action: junk[4],
              });
              expect(listed.result.observation).toMatchObject({ type: 'dir', path: '/tmp' });
            } finally {
              await client.call('Destroy', { sandboxId: id });
            }
          } finally {
            client.close();
          }
        }));

      it('Envs.Step: junk is an observation and the episode goes on', () =>
        attack('policy', 'Envs Step with junk actions', async () => {
          const client = new WireClient(address, ENVS, { token: IN_PROCESS_NODE_TOKEN, metadata });
          try {
            const { envId } = await client.call('Make', { spec: { kind: 'sandbox', ...BUSYBOX } });
            try {
              await client.call('Reset', { envId });
              const bad = await client.call('Step', {
                envId,
                stepIndex: 0,
                action: { type: 'exec', command: 'echo', env: { X: 'a\0b' } },
              });
              expect(bad.outcome).toEqual({ kind: 'ok' });
              expect(bad.observation).toMatchObject({ type: 'error', code: 'invalid_action' });
              const good = await client.call('Step', {
                envId,
                stepIndex: 1,
                action: { type: 'exec', command: ['echo', 'next'] },
              });
              expect(good.observation).toMatchObject({ type: 'exec', stdout: 'next\n' });
            } finally {
              await client.call('Close', { envId });
            }
          } finally {
            client.close();
          }
        }));

      it('Envs.Step and Sandboxes.Step: another action at a step index is a divergence; a concurrent retry runs once', () =>
        attack('policy', 'Step retries with another action, and at once', async () => {
          const envs = new WireClient(address, ENVS, { token: IN_PROCESS_NODE_TOKEN, metadata });
          const sandboxes = new WireClient(address, SANDBOXES, { token: IN_PROCESS_NODE_TOKEN, metadata });
          const count = { type: 'exec', command: 'echo x >> /tmp/count; wc -l < /tmp/count' };
          const others: unknown[] = [
            { type: 'exec', command: 'id' },
            { type: 'read_file', path: '/etc/passwd' },
            'junk',
            { type: 'exec', command: 'ls', cwd: 'relative' },
          ];
          try {
            const { envId } = await envs.call('Make', { spec: { kind: 'sandbox', ...BUSYBOX } });
            try {
              await envs.call('Reset', { envId });
              const first = await envs.call('Step', { envId, stepIndex: 0, action: count });
              expect(first.observation).toMatchObject({ stdout: '1\n' });
              for (const action of others)
                await expect(envs.call('Step', { envId, stepIndex: 0, action })).rejects.toMatchObject({
                  code: 'divergence',
                });
              // the same action, its keys in another order: the same answer, replayed
              const again = await envs.call('Step', {
                envId,
                stepIndex: 0,
                action: { command: count.command, type: 'exec' },
              });
              expect(again.observation).toEqual(first.observation);
              expect(again.info).toMatchObject({ replayed: true });
              // two identical calls at once: the step runs once, and both get its answer
              const [a, b] = await Promise.all(
                [0, 1].map(() => envs.call('Step', { envId, stepIndex: 1, action: count })),
              );
              expect(a!.observation).toEqual(b!.observation);
              expect(a!.observation).toMatchObject({ stdout: '2\n' });
              const after = await envs.call('Step', {
                envId,
                stepIndex: 2,
                action: { type: 'exec', command: 'wc -l < /tmp/count' },
              });
              expect(after.observation).toMatchObject({ stdout: '2\n' });
            } finally {
              await envs.call('Close', { envId });
            }
            // the same through Sandboxes.Step
            const { id } = await sandboxes.call('Create', { request: { environment: 'busybox:latest' } });
            try {
              const step = (stepIndex: number, action: unknown) =>
                sandboxes.call('Step', { sandboxId: id, episodeId: 'e', stepIndex, action });
              await step(0, count);
              for (const action of others)
                await expect(step(0, action)).rejects.toMatchObject({ code: 'divergence' });
              const [a, b] = await Promise.all([step(1, count), step(1, count)]);
              expect(a.result.observation).toEqual(b.result.observation);
              expect(
                (await step(2, { type: 'exec', command: 'wc -l < /tmp/count' })).result.observation,
              ).toMatchObject({
                stdout: '2\n',
              });
            } finally {
              await sandboxes.call('Destroy', { sandboxId: id });
            }
          } finally {
            envs.close();
            sandboxes.close();
          }
        }));

      it.skipIf(spawnSync(PYTHON, ['-c', 'import grpc, msgpack']).status !== 0)(
        'the Python client: junk is an observation and the episode goes on',
        () =>
          attack('policy', 'Python client step with junk actions', async () => {
            const script = [
              'import json, sys',
              'from sandgym import Platform, SandgymEnv',
              "with Platform.connect(sys.argv[1], sys.argv[2], project='policy') as platform:",
              "    env = SandgymEnv(platform, {'kind': 'sandbox', 'sandbox': {'environment': 'busybox:latest'}})",
              '    env.reset()',
              '    out = []',
              "    for action in [{'type': 'exec', 'command': 'ls', 'timeoutMs': 1.5}, {'type': 'read_file', 'path': 'x'}, ['exec'], {'type': 'exec', 'command': ['echo', 'py']}]:",
              '        observation, reward, terminated, truncated, info = env.step(action)',
              "        out.append([observation, reward, terminated, info['outcome']])",
              '    env.close()',
              '    print(json.dumps(out))',
            ].join('\n');
            const child = spawn(PYTHON, ['-c', script, `grpc://${address}`, IN_PROCESS_NODE_TOKEN], {
              env: { ...process.env, PYTHONPATH: resolve('python') },
            });
            let stdout = '';
            let stderr = '';
            child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
            child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
            const status = await new Promise((done) => child.once('exit', done));
            expect(status, stderr).toBe(0);
            const steps = JSON.parse(stdout) as [Record<string, unknown>, number, boolean, unknown][];
            for (const [observation, reward, terminated, outcome] of steps.slice(0, 3)) {
              expect(observation).toMatchObject({ type: 'error', code: 'invalid_action' });
              expect([reward, terminated, outcome]).toEqual([0, false, { kind: 'ok' }]);
            }
            expect(steps[3]![0]).toMatchObject({ type: 'exec', stdout: 'py\n' });
          }),
      );
    });
  });

  describe("a model's answers are bounded, validated and the agent's own failure", () => {
    const run = async (
      scenario: string,
      options: { requestTimeoutMs?: number } = {},
    ): Promise<EpisodeReport> => {
      const [report] = await evaluate(
        test.platform,
        tasks,
        openAiAgent({ model: scenario, baseUrl, apiKey: API_KEY, ...options }),
        { concurrency: 1 },
      );
      expectNoKey(JSON.stringify(report), `the report of ${scenario}`);
      return report!;
    };
    /** The agent's failure: scored 0 with the reason, never masked. */
    const expectAgentFailure = (report: EpisodeReport, reason: RegExp): void => {
      expect(report.outcome).toEqual({ kind: 'ok' });
      expect(report.reward).toBe(0);
      expect(report.agentFailure).toMatch(reason);
    };

    it('an honest model still solves the task (the twin)', async () => {
      const report = await run('honest');
      expect([report.outcome, report.reward]).toEqual([{ kind: 'ok' }, 1]);
      expect(report.trajectory?.map((s) => s.usage)).toEqual([
        { promptTokens: 10, completionTokens: 5 },
        { promptTokens: 10, completionTokens: 5 },
      ]);
    });

    it('a 400 MB answer is cut at the cap, and fails the agent', () =>
      attack('policy', 'model answers 400 MB', async () => {
        sent.hugeBytes = 0;
        expectAgentFailure(await run('huge'), /larger than|bytes/);
        // the agent hung up long before the end: it never held the answer whole
        await expect.poll(() => sent.hugeBytes).toBeGreaterThan(0);
        expect(sent.hugeBytes).toBeLessThan(100 * MIB);
        expectAgentFailure(await run('huge-declared'), /larger than|bytes/);
      }));

    it('an answer dripped a byte at a time fails the agent at its time limit', () =>
      attack('policy', 'model drips its answer', async () => {
        expectAgentFailure(await run('drip', { requestTimeoutMs: 1500 }), /time|ms/);
      }));

    it('truncated, non-JSON and misshapen answers fail the agent', async () => {
      for (const [scenario, reason] of [
        ['truncated', /JSON/],
        ['not-json', /JSON/],
        ['no-choices', /choices/],
        ['wrong-shape', /message/],
        ['giant-arguments', /larger than|bytes/],
        ['many-calls', /tool_calls/],
      ] as const)
        await attack('policy', `model answers ${scenario}`, async () =>
          expectAgentFailure(await run(scenario), reason),
        );
    });

    it('usage that is negative, fractional, huge, a string, infinite or NaN fails the agent', async () => {
      for (const scenario of Object.keys(BAD_USAGE).map((name) => `usage-${name}`))
        await attack('policy', `model reports ${scenario}`, async () => {
          const report = await run(scenario);
          expectAgentFailure(report, /usage|JSON/);
          // no token count reaches the report's metrics
          expect(report.trajectory ?? []).toEqual([]);
        });
    });

    it('error bodies that echo the key never reach the report; status decides whose failure it is', async () => {
      await attack('policy', 'a 401 and a 403 that echo the key', async () => {
        for (const scenario of ['status-401', 'status-403']) {
          const report = await run(scenario);
          // a refused key is the eval's configuration, not the policy: infrastructure, and says so
          expect(report.outcome).toMatchObject({ kind: 'infra_failure' });
          expect(JSON.stringify(report)).toMatch(/\[redacted\]/);
        }
      });
      await attack('policy', 'a 400 that echoes the request and its headers', async () => {
        // the conversation the agent built was refused (too long for the model, say): its failure
        expectAgentFailure(await run('status-400-echo'), /refused|400/);
      });
      await attack('policy', 'a completion that hands the key back', async () => {
        const report = await run('echo-key');
        // the key was there, in every form, and each went
        expect(report.trajectory?.[0]?.action).toMatchObject({ type: 'exec' });
        expect(JSON.stringify(report.trajectory?.[0])).toMatch(/echo \[redacted\]/);
        // nor does it reach the sandbox or its trajectory log
        const log = await readFile(join(test.dataDir, 'trajectories', `${report.sandboxId}.log`)).catch(() =>
          Buffer.alloc(0),
        );
        expectNoKey(log.toString('latin1'), 'the trajectory log');
      });
      // the twins: a server that fails (5xx, 429) or cannot be reached is infrastructure
      for (const scenario of ['status-500', 'status-429'])
        expect((await run(scenario)).outcome).toMatchObject({
          kind: 'infra_failure',
          reason: 'platform_error',
        });
      const closed = createServer();
      const closedUrl = await listen(closed);
      await new Promise((done) => closed.close(done));
      const [refused] = await evaluate(
        test.platform,
        tasks,
        openAiAgent({ model: 'honest', baseUrl: closedUrl, apiKey: API_KEY }),
        { concurrency: 1 },
      );
      expect(refused?.outcome).toMatchObject({ kind: 'infra_failure' });
    });

    it('`sandgym eval` writes no secret into its JSON, ATIF, HTML, journal, logs or messages', () =>
      attack('policy', 'the key in every output of sandgym eval', async () => {
        await using cli = await createTestPlatform('policy-eval-cli', { privateStore: true });
        const out = join(cli.dataDir, 'out');
        await mkdir(out, { recursive: true });
        for (const scenario of ['echo-key', 'status-401', 'status-400-echo']) {
          const eval_ = await runCli(
            [
              'eval',
              OJ_TASK,
              '--agent',
              `openai:${scenario}`,
              '--base-url',
              baseUrl,
              '--json',
              join(out, `${scenario}.json`),
              '--atif',
              join(out, `${scenario}-atif`),
              '--report',
              join(out, `${scenario}.html`),
            ],
            { SANDGYM_DATA_DIR: cli.dataDir, SANDGYM_LLM_API_KEY: API_KEY },
          );
          // a refused key is the eval's infrastructure (exit 3); the others are scored episodes
          expect(eval_.status, eval_.stderr).toBe(scenario === 'status-401' ? 3 : 1);
          expectNoKey(eval_.stderr, `the messages of ${scenario}`);
        }
        const files = await filesBelow(cli.dataDir);
        expect(files.some((file) => file.endsWith('.html'))).toBe(true);
        // every file the eval wrote (not the sparse scratch volume, whose sandboxes' files are gone)
        for (const file of files)
          if ((await stat(file)).size < 64 * MIB)
            expectNoKey((await readFile(file)).toString('latin1'), file);
      }));
  });

  describe('what a policy or its model returns never costs the eval, its results or the key', () => {
    const model = (name: string, options: { requestTimeoutMs?: number } = {}) =>
      openAiAgent({ model: name, baseUrl, apiKey: API_KEY, ...options });
    const expectScored = (report: EpisodeReport | undefined, reward: number): void => {
      expect(report?.outcome, report?.error).toEqual({ kind: 'ok' });
      expect(report?.reward, report?.agentFailure).toBe(reward);
    };

    it('tool-call arguments that are JSON but no object, or no JSON, are invalid calls the model is told of', async () => {
      for (const name of Object.keys(ODD_ARGUMENTS))
        await attack('policy', `tool-call arguments: ${name}`, async () => {
          const [report] = await evaluate(test.platform, tasks, model(`args-${name}`), { concurrency: 1 });
          // never a TypeError, and never echoed back malformed for the endpoint to fail on (a 5xx)
          expectScored(report, 1);
        });
    });

    it('long outputs over many turns keep the conversation bounded', () =>
      attack('policy', 'conversation growth', async () => {
        sent.largestRequest = 0;
        const [report] = await evaluate(test.platform, tasks, model('chatty'), { concurrency: 1 });
        expectScored(report, 1);
        expect(report?.steps).toBe(14);
        // 12 turns of 2 MiB of output and 300 KiB of words: what is sent stays bounded
        expect(sent.largestRequest).toBeLessThan(12 * MIB);
      }));

    it('the key pieced together in the sandbox, or handed back escaped, is in no result, step or journal', () =>
      attack('policy', 'the key in pieces and escapes', async () => {
        const journal = await EvalJournal.open(
          join(test.dataDir, 'keys', `${randomBytes(4).toString('hex')}.jsonl`),
        );
        const steps: unknown[] = [];
        const [report] = await evaluate(test.platform, tasks, model('piece-key'), {
          concurrency: 1,
          journal,
          onStep: (step) => steps.push(step),
        });
        expectScored(report, 0);
        const exec = report!.trajectory![0]!.observation as { stdout: string };
        expect(exec.stdout).toMatch(/\[redacted\]/);
        expectNoKeyPiece(JSON.stringify(report), 'the report');
        expectNoKeyPiece(JSON.stringify(steps), 'the steps');
        expectNoKeyPiece(await readFile(journal.path, 'utf8'), 'the journal');
        // the honest twin: text that merely looks like a key's start is kept
        expect(secretRedactor([API_KEY]).text('sk-proj and a1b2')).toBe('sk-proj and a1b2');
      }));

    it('a key given in the base URL is in no report', () =>
      attack('policy', "the key as the base URL's credentials", async () => {
        const secret = `pw-${randomBytes(12).toString('hex')}`;
        const withCredentials = baseUrl.replace('http://', `http://user:${secret}@`);
        const [report] = await evaluate(
          test.platform,
          tasks,
          openAiAgent({ model: 'honest', baseUrl: withCredentials }),
          { concurrency: 1 },
        );
        // fetch refuses such a URL and quotes it: the eval's set-up, reported, without the secret
        expect(report?.outcome).toMatchObject({ kind: 'infra_failure' });
        expect(JSON.stringify(report)).not.toContain(secret);
        expect(JSON.stringify(report)).toMatch(/\[redacted\]/);
      }));

    it('an agent that never decides ends its episode, scored, and the eval goes on', () =>
      attack('policy', 'an agent that never returns', async () => {
        const never: Agent = (_observation, { task }) =>
          task.id === 'slow' ? new Promise(() => {}) : Promise.resolve({ type: 'submit' });
        const [slow, fast] = await evaluate(
          test.platform,
          [{ ...tasks[0]!, id: 'slow' }, tasks[0]!],
          () => never,
          {
            concurrency: 2,
            decisionTimeoutMs: 2_000,
          },
        );
        expectScored(slow, 0);
        expect(slow?.agentFailure).toMatch(/decide within 2000 ms/);
        expectScored(fast, 0);
      }));

    it("a decision that cannot be read is the agent's failure", async () => {
      const { proxy, revoke } = Proxy.revocable({ action: { type: 'submit' } }, {});
      revoke();
      const throwing = Object.defineProperty({}, 'action', {
        enumerable: true,
        get() {
          throw new Error('no action for you');
        },
      });
      const thenable = Object.defineProperty({}, 'then', {
        get() {
          throw new Error('a then that throws');
        },
      });
      const answers: [string, () => unknown][] = [
        ['a revoked proxy', () => proxy],
        ['a getter that throws', () => throwing],
        ['a then that throws', () => thenable],
        [
          'a throw of its own',
          () => {
            throw new TypeError('undefined is not a function');
          },
        ],
      ];
      for (const [name, answer] of answers)
        await attack('policy', `agent decision: ${name}`, async () => {
          const odd = (() => Promise.resolve().then(answer)) as unknown as Agent;
          const [report] = await evaluate(test.platform, tasks, () => odd, { concurrency: 1 });
          expectScored(report, 0);
          expect(report?.agentFailure).toBeTruthy();
        });
      // a decision whose action is unreadable is an invalid action, and the episode goes on
      const [report] = await evaluate(
        test.platform,
        tasks,
        () =>
          (_o, { stepIndex }) =>
            Promise.resolve(
              stepIndex === 0 ? ({ action: proxy } as unknown as SandboxAction) : { type: 'submit' },
            ),
        { concurrency: 1 },
      );
      expectScored(report, 0);
      expect(report?.trajectory?.[0]?.observation).toMatchObject({ type: 'error', code: 'invalid_action' });
    });

    it('results the journal cannot serialise are written anyway, and read back', () =>
      attack('policy', 'a journal entry JSON cannot hold', async () => {
        const journal = await EvalJournal.open(
          join(test.dataDir, 'odd', `${randomBytes(4).toString('hex')}.jsonl`),
        );
        const cycle: Record<string, unknown> = {};
        cycle['self'] = cycle;
        const base = { reward: 1, outcome: { kind: 'ok' as const }, steps: 1, durationMs: 1, tampered: [] };
        const odd: [string, unknown][] = [
          ['bigint', 10n],
          ['cycle', cycle],
          [
            'toJSON',
            {
              toJSON: () => {
                throw new Error('no');
              },
            },
          ],
        ];
        for (const [task, value] of odd) await journal.record({ ...base, task, details: { value } });
        await journal.record({ ...base, task: 'plain' });
        const again = await EvalJournal.open(journal.path);
        for (const task of [...odd.map(([t]) => t), 'plain']) expect(again.get(task)?.reward).toBe(1);
        expect(again.get('bigint')?.details).toEqual({ value: '10n' });
      }));

    it('two tasks with one id are refused, naming both', () =>
      attack('policy', 'duplicate task ids', async () => {
        const twin = { ...tasks[0]!, source: `${tasks[0]!.source}.copy` };
        await expect(
          evaluate(test.platform, [tasks[0]!, twin], nopAgent, { concurrency: 1 }),
        ).rejects.toThrow(`Two tasks have the id "${twin.id}": ${tasks[0]!.source} and ${twin.source}`);
        // the honest twin: the same task under another id runs as its own episode
        const reports = await evaluate(test.platform, [tasks[0]!, { ...twin, id: 'other' }], nopAgent, {
          concurrency: 1,
        });
        expect(reports.map((r) => [r.task, r.outcome.kind])).toEqual([
          [tasks[0]!.id, 'ok'],
          ['other', 'ok'],
        ]);
      }));
  });

  it("changes larger than the project's whole store quota are scored 0 with the reason", () =>
    attack('policy', 'a diff larger than the store quota', async () => {
      await using node = await createTestPlatform('policy-store-quota', { privateStore: true });
      const token = 'small-store-token-5e3c1a9f7d2b4680';
      const cluster = await startInProcessCluster({
        dataDir: node.dataDir,
        storeDir: join(node.dataDir, 'store'),
        nodeId: 'quota',
        grants: { [token]: { project: 'small', maxSandboxes: 4, maxStoreBytes: 4 * MIB } },
        platform: { freshLayerHoldMs: 0 },
      });
      try {
        await using platform = await Platform.connect(cluster.url, { token });
        const solve = { type: 'write_file', path: '/work/solution.sh', content: OJ_SOLUTION } as const;
        // the right program, with 10 MiB of comments: more than the project may ever store
        const padded: SandboxAction[] = [
          solve,
          {
            type: 'exec',
            command: "head -c 8388608 /dev/urandom | base64 | sed 's/^/#/' >> /work/solution.sh",
          },
        ];
        const [report] = await evaluate(platform, tasks, () => scriptedAgent(padded), { concurrency: 1 });
        expect(report?.outcome, report?.error).toEqual({ kind: 'ok' });
        expect(report?.reward).toBe(0);
        expect(report?.details?.['reason']).toMatch(/store quota/);
        // the honest twin: the program alone is graded as usual
        const [fair] = await evaluate(platform, tasks, () => scriptedAgent([solve]), { concurrency: 1 });
        expect(fair?.outcome, fair?.error).toEqual({ kind: 'ok' });
        expect(fair?.reward).toBe(1);
      } finally {
        await cluster.close();
      }
    }));

  describe('the resume journal covers what the agent is', () => {
    /** Two OJ tasks, `a` and `b`; b says "(task b)". */
    async function twoTasks(dir: string): Promise<string> {
      const tasksDir = join(dir, 'tasks');
      await mkdir(tasksDir, { recursive: true });
      const problem = JSON.parse(await readFile(OJ_TASK, 'utf8')) as Record<string, unknown>;
      await writeFile(join(tasksDir, 'a.oj.json'), JSON.stringify({ ...problem, id: 'a' }));
      await writeFile(
        join(tasksDir, 'b.oj.json'),
        JSON.stringify({ ...problem, id: 'b', statement: `${String(problem['statement'])} (task b)` }),
      );
      return tasksDir;
    }

    /** An agent module that solves the task; on task b it waits for ever while `marker` exists. */
    function agentModule(marker: string, solves: boolean): string {
      return [
        "import { existsSync } from 'node:fs';",
        'export default () => async (_observation, { task, stepIndex }) => {',
        `  if (task.id === 'b' && existsSync(${JSON.stringify(marker)})) await new Promise(() => {});`,
        solves
          ? `  if (stepIndex === 0) return { type: 'write_file', path: '/work/solution.sh', content: ${JSON.stringify(OJ_SOLUTION)} };`
          : '',
        "  return { type: 'submit' };",
        '};',
      ].join('\n');
    }

    /** Runs the eval until task a is in its journal, then kills it as a crash would. */
    async function interrupted(args: string[], env: Record<string, string>, dataDir: string): Promise<void> {
      const child = spawn('node', [CLI, 'eval', ...args], {
        env: { ...process.env, ...env },
        stdio: 'ignore',
      });
      const exited = new Promise((done) => child.once('exit', done));
      try {
        await expect
          .poll(
            async () => {
              for (const file of await filesBelow(join(dataDir, 'evals')))
                if (/^\{"task":"a"/m.test(await readFile(file, 'utf8'))) return true;
              expect(child.exitCode).toBeNull();
              return false;
            },
            { timeout: 120_000, interval: 100 },
          )
          .toBe(true);
      } finally {
        child.kill('SIGKILL');
        await exited;
      }
    }

    /** Task a's reward in a rerun's report; the killed run's sandboxes and residue go after. */
    async function rerun(args: string[], env: Record<string, string>, dataDir: string): Promise<number> {
      const out = join(dataDir, 'rerun.json');
      try {
        const second = await runCli(['eval', ...args, '--json', out], env);
        expect(second.stderr).not.toMatch(/resuming/);
        const report = JSON.parse(await readFile(out, 'utf8')) as { episodes: EpisodeReport[] };
        return report.episodes.find((e) => e.task === 'a')!.reward;
      } finally {
        const ps = spawnSync('node', [CLI, 'ps', '--json'], {
          env: { ...process.env, ...env },
          encoding: 'utf8',
        });
        for (const { id } of (JSON.parse(ps.stdout || '{"sandboxes":[]}') as { sandboxes: { id: string }[] })
          .sandboxes)
          spawnSync('node', [CLI, 'kill', id], { env: { ...process.env, ...env } });
        // and what the kill cut off mid-create (a sandbox no record lists yet), as after any crash
        spawnSync('node', [CLI, 'gc'], { env: { ...process.env, ...env } });
      }
    }

    /** An eval of the two tasks with a module agent, killed once task a finished; its rerun will not wait. */
    async function interruptedModuleEval(dataDir: string) {
      const tasksDir = await twoTasks(dataDir);
      const marker = join(dataDir, 'hang');
      const agent = join(dataDir, 'agent.mjs');
      const env = { SANDGYM_DATA_DIR: dataDir };
      await writeFile(marker, '');
      await writeFile(agent, agentModule(marker, true));
      const args = [tasksDir, '--agent', agent, '--concurrency', '1'];
      await interrupted(args, env, dataDir);
      await rm(marker);
      return { tasksDir, agent, marker, env, args };
    }

    it('an edited agent module does not reuse the old one’s results', () =>
      attack('policy', 'rerun with an edited agent module', async () => {
        await using cli = await createTestPlatform('policy-journal-module', { privateStore: true });
        const { agent, marker, env, args } = await interruptedModuleEval(cli.dataDir);
        // the module now submits at once: task a must be run again, and score 0
        await writeFile(agent, agentModule(marker, false));
        expect(await rerun(args, env, cli.dataDir)).toBe(0);
      }));

    it('an edited helper module the agent imports does not reuse the old results', () =>
      attack('policy', 'rerun with an edited helper of the agent module', async () => {
        await using cli = await createTestPlatform('policy-journal-helper', { privateStore: true });
        const tasksDir = await twoTasks(cli.dataDir);
        const marker = join(cli.dataDir, 'hang');
        const agent = join(cli.dataDir, 'agent.mjs');
        const helper = join(cli.dataDir, 'lib', 'plan.mjs');
        const env = { SANDGYM_DATA_DIR: cli.dataDir };
        await mkdir(join(cli.dataDir, 'lib'), { recursive: true });
        await writeFile(marker, '');
        await writeFile(helper, 'export const solves = true;\n');
        // the module itself never changes: what it does comes from its helper
        await writeFile(
          agent,
          agentModule(marker, true)
            .replace(
              "import { existsSync } from 'node:fs';",
              "import { existsSync } from 'node:fs';\nimport { solves } from './lib/plan.mjs';",
            )
            .replace('if (stepIndex === 0)', 'if (solves && stepIndex === 0)'),
        );
        const args = [tasksDir, '--agent', agent, '--concurrency', '1'];
        await interrupted(args, env, cli.dataDir);
        await rm(marker);
        await writeFile(helper, 'export const solves = false;\n');
        expect(await rerun(args, env, cli.dataDir)).toBe(0);
      }));

    it('an edit to a file a task reads through a symlink changes its journal', () =>
      attack('policy', 'rerun after a shared tests folder changed', async () => {
        const root = join(test.dataDir, `shared-tests-${randomBytes(4).toString('hex')}`);
        const task = join(root, 'task');
        // the tests through a link inside the task folder: one out of it is refused at load
        const shared = join(task, 'shared', 'tests');
        const outside = join(root, 'outside-tests');
        await mkdir(shared, { recursive: true });
        await mkdir(outside, { recursive: true });
        await mkdir(join(task, 'environment'), { recursive: true });
        await writeFile(join(task, 'instruction.md'), 'Do nothing.\n');
        await writeFile(join(task, 'environment', 'Dockerfile'), 'FROM busybox:latest\n');
        await writeFile(join(task, 'task.toml'), '');
        await writeFile(join(shared, 'test.sh'), 'echo 1 > /logs/verifier/reward.txt\n');
        await writeFile(join(outside, 'test.sh'), 'echo 1 > /logs/verifier/reward.txt\n');
        await symlink(outside, join(task, 'tests'));
        await expect(loadTasks([task])).rejects.toThrow(/"tests" is outside/);
        await rm(join(task, 'tests'));
        await symlink('shared/tests', join(task, 'tests'));
        const key = async () => EvalJournal.pathFor(root, { tasks: await loadTasks([task]), agent: 'nop' });
        const before = await key();
        // the honest twin: nothing changed, the same journal
        expect(await key()).toBe(before);
        await writeFile(join(shared, 'test.sh'), 'echo 0 > /logs/verifier/reward.txt\n');
        expect(await key()).not.toBe(before);
      }));

    it('another --base-url does not reuse the old endpoint’s results', () =>
      attack('policy', 'rerun with another --base-url', async () => {
        await using cli = await createTestPlatform('policy-journal-url', { privateStore: true });
        const tasksDir = await twoTasks(cli.dataDir);
        // the same model name on another endpoint, which only submits
        const other = fakeModel({ ...SCENARIOS, journal: SCENARIOS['journal-other']! });
        const otherUrl = await listen(other);
        try {
          const env = { SANDGYM_DATA_DIR: cli.dataDir };
          const args = (url: string) => [
            tasksDir,
            '--agent',
            'openai:journal',
            '--base-url',
            url,
            '--concurrency',
            '1',
          ];
          await interrupted(args(baseUrl), env, cli.dataDir);
          expect(await rerun(args(otherUrl), env, cli.dataDir)).toBe(0);
        } finally {
          other.closeAllConnections();
          await new Promise((done) => other.close(done));
        }
      }));

    it('an edited task does not reuse its old result', () =>
      attack('policy', 'rerun after a task changed', async () => {
        await using cli = await createTestPlatform('policy-journal-task', { privateStore: true });
        const { tasksDir, env, args } = await interruptedModuleEval(cli.dataDir);
        // task a now expects something else: the same agent's old answer no longer passes
        const a = JSON.parse(await readFile(join(tasksDir, 'a.oj.json'), 'utf8')) as {
          tests: { stdin: string; stdout: string }[];
        };
        a.tests[0]!.stdout = 'changed\n';
        await writeFile(join(tasksDir, 'a.oj.json'), JSON.stringify(a));
        expect(await rerun(args, env, cli.dataDir)).toBe(0);
      }));
  });

  describe("a task's numbers are checked at load, and a bad one is the author's error", () => {
    const harbor = async (dir: string, toml: string): Promise<string> => {
      await mkdir(join(dir, 'environment'), { recursive: true });
      await mkdir(join(dir, 'tests'), { recursive: true });
      await writeFile(join(dir, 'instruction.md'), 'Do nothing.\n');
      await writeFile(join(dir, 'environment', 'Dockerfile'), 'FROM busybox:latest\n');
      await writeFile(join(dir, 'tests', 'test.sh'), 'echo 1 > /logs/verifier/reward.txt\n');
      await writeFile(join(dir, 'task.toml'), toml);
      return dir;
    };

    it('refuses absurd cpus, memory, disk and timeouts in every format, naming the field and range', async () => {
      const root = join(test.dataDir, 'limits');
      const problem = JSON.parse(await readFile(OJ_TASK, 'utf8')) as Record<string, unknown>;
      const oj = async (name: string, fields: Record<string, unknown>): Promise<string> => {
        const path = join(root, `${name}.oj.json`);
        await writeFile(path, JSON.stringify({ ...problem, ...fields }));
        return path;
      };
      const harborCases: [string, string, RegExp][] = [
        ['cpus', '[environment]\ncpus = 100000\n', /environment\.cpus.*1024/],
        ['memory', '[environment]\nmemory_mb = 1000000000\n', /environment\.memory_mb/],
        ['storage', '[environment]\nstorage_mb = 1e13\n', /environment\.storage_mb/],
        ['agent timeout', '[agent]\ntimeout_sec = 1e12\n', /agent\.timeout_sec.*604800/],
        ['verifier timeout', '[verifier]\ntimeout_sec = 1e12\n', /verifier\.timeout_sec/],
        ['build timeout', '[environment]\nbuild_timeout_sec = 1e12\n', /build_timeout_sec/],
      ];
      const cases: [string, () => Promise<string>, RegExp][] = [
        ...harborCases.map(([name, toml, message]): [string, () => Promise<string>, RegExp] => [
          `harbor ${name}`,
          () => harbor(join(root, name), toml),
          message,
        ]),
        [
          'terminal-bench timeouts',
          async () => {
            const dir = join(root, 'tb');
            await mkdir(dir, { recursive: true });
            await writeFile(
              join(dir, 'task.yaml'),
              'instruction: x\ndifficulty: easy\nmax_agent_timeout_sec: 1e15\nmax_test_timeout_sec: 1e15\n',
            );
            await writeFile(join(dir, 'Dockerfile'), 'FROM busybox:latest\n');
            await writeFile(join(dir, 'run-tests.sh'), 'true\n');
            return dir;
          },
          /max_agent_timeout_sec/,
        ],
        ['OJ time limit', () => oj('time', { time_limit_ms: 1e15 }), /time_limit_ms/],
        ['OJ memory limit', () => oj('memory', { memory_limit_mb: 1e9 }), /memory_limit_mb/],
        [
          'OJ judging too long in all',
          () =>
            oj('many', {
              tests: Array.from({ length: 10_000 }, () => ({ stdin: 'a\n', stdout: 'a\n' })),
              time_limit_ms: 600_000,
            }),
          /time_limit_ms/,
        ],
      ];
      for (const [name, make, message] of cases)
        await attack('policy', `task author: ${name}`, async () => {
          const path = await make();
          await expect(loadTasks([path])).rejects.toMatchObject({ code: 'invalid_argument', message });
        });
      // the honest twins: the example tasks load as they are
      expect((await loadTasks([resolve('examples/tasks')])).length).toBeGreaterThan(3);
    });

    it('`sandgym eval` exits 2 for such a task, and TaskEnv calls a task built in code a task_error', () =>
      attack('policy', 'task author: cpus = 100000 through eval and TaskEnv', async () => {
        const dir = await harbor(join(test.dataDir, 'limits-cli'), '[environment]\ncpus = 100000\n');
        const eval_ = await runCli(['eval', dir, '--agent', 'nop'], { SANDGYM_DATA_DIR: test.dataDir });
        expect(eval_.status, eval_.stderr).toBe(2);
        expect(eval_.stderr).toMatch(/environment\.cpus/);
        const [task] = tasks;
        for (const odd of [
          { ...task!, resources: { cpu: 100_000, memoryMib: 256 } },
          { ...task!, resources: { cpu: 1, memoryMib: 1e12 } },
          { ...task!, agentTimeoutMs: 1e18 },
          { ...task!, verifierTimeoutMs: -1 },
        ]) {
          const [report] = await evaluate(test.platform, [odd], nopAgent, { concurrency: 1 });
          expect(report?.outcome).toMatchObject({ kind: 'task_error' });
        }
      }));
  });
});

/** The CLI with `env` over this process's, without blocking this event loop (the model is here). */
function runCli(
  args: string[],
  env: Record<string, string>,
): Promise<{ status: number | null; stderr: string }> {
  const child = spawn('node', [CLI, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  // `close`, not `exit`: after its streams are read to the end
  return new Promise((done) => child.once('close', (status) => done({ status, stderr })));
}
