import { cp, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { loadTasks } from '../../src/env/index.ts';
import {
  atifTrajectorySchema,
  evaluate,
  openAiAgent,
  writeAtif,
  type EpisodeReport,
} from '../../src/rollout/index.ts';
import { fakeTokens, startFakeModel, type ChatRequest, type FakeModel } from '../support/fake-model.ts';
import { createTestPlatform } from '../support/platform.ts';

const TASK = resolve('examples/tasks/hello-file');
const WRITE = JSON.stringify({ command: "printf 'hello sandgym\\n' > /app/hello.txt" });

/**
 * A model that answers by how many answers it gave: first words and no call (nudged), then a
 * call the env refuses, then two calls at once (write, read back), then submit.
 */
const scripted: FakeModel = (request) => {
  const answered = request.messages.filter((m) => m.role === 'assistant').length;
  if (answered === 0) return { content: 'Let me think.' };
  if (answered === 1) return { calls: [{ id: 'bad-1', name: 'exec', arguments: '{"cwd":"relative"}' }] };
  if (answered === 2)
    return {
      content: 'Writing, then checking.',
      calls: [
        { id: 'm-a', name: 'exec', arguments: WRITE },
        { id: 'm-b', name: 'read_file', arguments: '{"path":"/app/hello.txt"}' },
      ],
    };
  return { content: 'Done.', calls: [{ id: 'm-done', name: 'submit', arguments: '{}' }] };
};

async function episode(
  name: string,
  model: FakeModel,
  options: Partial<Parameters<typeof openAiAgent>[0]> = {},
  task = TASK,
): Promise<{ report: EpisodeReport; requests: ChatRequest[]; atifDir: string }> {
  await using fake = await startFakeModel(model);
  await using env = await createTestPlatform(name);
  const tasks = await loadTasks([task]);
  const agent = openAiAgent({ model: 'fake', baseUrl: fake.baseUrl, tokenIds: true, ...options });
  const [report] = await evaluate(env.platform, tasks, agent, { concurrency: 1 });
  const atifDir = await mkdtemp(join(tmpdir(), 'sandgym-atif-'));
  await writeAtif(atifDir, [report!], () => tasks[0]!.instruction, {
    name: 'openai:fake',
    version: 'test',
    modelName: 'fake',
  });
  return { report: report!, requests: fake.requests, atifDir };
}

/** Harbor's own ATIF model (pydantic, in .venv) takes the file, or this throws its complaint. */
async function harborValidates(path: string): Promise<void> {
  const check =
    'import sys\nfrom harbor.models.trajectories import Trajectory\nTrajectory.model_validate_json(open(sys.argv[1]).read())';
  await promisify(execFile)(resolve('.venv/bin/python'), ['-c', check, path]);
}

async function readAtif(dir: string) {
  const files = await readdir(dir);
  const json = files.find((f) => f.endsWith('.json'))!;
  await harborValidates(join(dir, json));
  const turns = files.find((f) => f.endsWith('.turns.jsonl'));
  return {
    trajectory: atifTrajectorySchema.parse(JSON.parse(await readFile(join(dir, json), 'utf8'))),
    turns: turns
      ? (await readFile(join(dir, turns), 'utf8'))
          .trim()
          .split('\n')
          .map((line) => JSON.parse(line) as { request: { messages: unknown[] } })
      : [],
  };
}

describe('token-level trajectories of the model agent', () => {
  it('keeps every answer, runs parallel calls in order, and records token ids and logprobs', async () => {
    const { report, requests, atifDir } = await episode('tokentraj', scripted, {
      temperature: 0.5,
      maxTokens: 321,
    });
    try {
      expect(report.outcome).toEqual({ kind: 'ok' });
      expect(report.reward).toBe(1);
      expect(requests[0]).not.toHaveProperty('parallel_tool_calls');
      expect(requests[0]).toMatchObject({
        temperature: 0.5,
        max_tokens: 321,
        logprobs: true,
        return_token_ids: true,
      });
      // both calls of the third answer ran, in order; their results went back in call order
      const afterParallel = requests[3]!.messages.filter((m) => m.role === 'tool').slice(-2);
      expect(afterParallel.map((m) => m.tool_call_id)).toEqual(['m-a', 'm-b']);
      expect(afterParallel[1]?.content).toMatch(/hello sandgym/);
      expect(report.trajectory!.map((s) => [s.action.type, s.callId])).toEqual([
        ['exec', 'm-a'],
        ['read_file', 'm-b'],
        ['submit', 'm-done'],
      ]);

      const { trajectory, turns } = await readAtif(atifDir);
      await rm(atifDir, { recursive: true, force: true });
      expect(trajectory.steps.map((s) => s.source)).toEqual([
        'system',
        'user',
        'agent',
        'agent',
        'agent',
        'agent',
      ]);
      expect(trajectory.steps[0]?.message).toBe(requests[0]!.messages[0]!.content);
      const [, , nudged, refused, parallel, submitted] = trajectory.steps;
      // an answer without a call, kept with what the model was told
      expect(nudged).toMatchObject({
        message: 'Let me think.',
        extra: { error: 'the answer made no tool call' },
      });
      expect(nudged?.observation?.results[0]?.content).toMatch(/Act through a tool call/);
      // a refused call, by the model's own id, with the refusal as its result
      expect(refused?.tool_calls?.[0]).toMatchObject({
        tool_call_id: 'bad-1',
        arguments: { cwd: 'relative' },
      });
      expect(refused?.observation?.results[0]).toMatchObject({ source_call_id: 'bad-1' });
      expect(refused?.observation?.results[0]?.content).toMatch(/^Invalid call: .*absolute/);
      // one answer, two calls, two results
      expect(parallel?.tool_calls?.map((c) => c.tool_call_id)).toEqual(['m-a', 'm-b']);
      expect(parallel?.observation?.results.map((r) => r.source_call_id)).toEqual(['m-a', 'm-b']);
      expect(parallel?.observation?.results[1]?.content).toMatch(/hello sandgym/);
      expect(parallel?.message).toBe('Writing, then checking.');
      // the token ids and logprobs the server returned, for the answer they belong to
      const said = 'Writing, then checking.' + 'exec' + WRITE + 'read_file' + '{"path":"/app/hello.txt"}';
      expect(parallel?.metrics?.completion_token_ids).toEqual(fakeTokens(said));
      expect(parallel?.metrics?.logprobs).toHaveLength(fakeTokens(said).length);
      expect(parallel?.metrics?.logprobs?.[1]).toBeCloseTo(-0.01);
      expect(parallel?.metrics?.prompt_token_ids?.length).toBeGreaterThan(0);
      expect(submitted?.tool_calls?.[0]).toMatchObject({ tool_call_id: 'm-done', function_name: 'submit' });
      expect(trajectory.final_metrics?.total_steps).toBe(6);

      // the per-turn records rebuild every request exactly as the server got it
      expect(turns).toHaveLength(requests.length);
      let previous: unknown[] = [];
      turns.forEach((turn, index) => {
        const messages = turn.request.messages.map((message, at) => message ?? previous[at]);
        // only what changed is recorded
        if (index > 0) expect(turn.request.messages.filter(Boolean).length).toBeLessThan(messages.length);
        expect(messages).toEqual(requests[index]!.messages);
        previous = messages;
      });
    } finally {
      await rm(atifDir, { recursive: true, force: true });
    }
  });

  it('runs one call per answer when parallel calls are off, telling the model the rest did not run', async () => {
    const { report, requests, atifDir } = await episode('tokentraj-serial', scripted, {
      parallelToolCalls: false,
    });
    await rm(atifDir, { recursive: true, force: true });
    expect(report.trajectory!.map((s) => s.callId)).toEqual(['m-a', 'm-done']);
    const told = requests[3]!.messages.find((m) => m.tool_call_id === 'm-b');
    expect(told?.content).toBe('Not run: one tool call per turn.');
    expect(requests[0]).toMatchObject({ parallel_tool_calls: false });
  });

  it('runs one call per answer when the task says so', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'sandgym-serial-task-'));
    try {
      const task = join(dir, 'hello-file');
      await cp(TASK, task, { recursive: true });
      const toml = await readFile(join(task, 'task.toml'), 'utf8');
      await writeFile(
        join(task, 'task.toml'),
        toml.replace('[agent]\n', '[agent]\nparallel_tool_calls = false\n'),
      );
      const { report, requests, atifDir } = await episode('tokentraj-serial-task', scripted, {}, task);
      await rm(atifDir, { recursive: true, force: true });
      expect(requests[0]).toMatchObject({ parallel_tool_calls: false });
      expect(report.trajectory!.map((s) => s.callId)).toEqual(['m-a', 'm-done']);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('never records a submit the model did not make', async () => {
    const { report, atifDir } = await episode('tokentraj-silent', () => ({ content: 'I will not.' }));
    try {
      expect(report.trajectory!.map((s) => s.action.type)).toEqual(['submit']);
      const { trajectory } = await readAtif(atifDir);
      const sources = trajectory.steps.map((s) => s.source);
      expect(sources).toEqual(['system', 'user', 'agent', 'agent', 'agent', 'agent', 'system']);
      expect(trajectory.steps.flatMap((s) => s.tool_calls ?? [])).toEqual([]);
      expect(trajectory.steps.at(-1)?.message).toMatch(/no usable tool call after 4 answers/);
    } finally {
      await rm(atifDir, { recursive: true, force: true });
    }
  });

  it('gives a call whose id the model reused an id of its own, so results stay matched', async () => {
    const { report, atifDir } = await episode('tokentraj-dup-ids', (request) => {
      const answered = request.messages.filter((m) => m.role === 'assistant').length;
      if (answered > 0) return { calls: [{ id: 'dup', name: 'submit', arguments: '{}' }] };
      return {
        calls: [
          { id: 'dup', name: 'exec', arguments: WRITE },
          { id: 'dup', name: 'read_file', arguments: '{"path":"/app/hello.txt"}' },
        ],
      };
    });
    try {
      expect(report.trajectory!.map((s) => s.callId)).toEqual(['dup', 'call_1', 'dup']);
      const { trajectory } = await readAtif(atifDir);
      expect(trajectory.steps[2]?.observation?.results.map((r) => r.source_call_id)).toEqual([
        'dup',
        'call_1',
      ]);
      expect(trajectory.steps[2]?.observation?.results[1]?.content).toMatch(/hello sandgym/);
    } finally {
      await rm(atifDir, { recursive: true, force: true });
    }
  });

  it('records a conversation past its cap in size linear in the turns, not in their square', async () => {
    // each turn: 400 KB of words and 512 KB of output kept, so the 8 MiB cap is passed by turn 10
    // and old outputs are cut every turn after; a record of every request whole would be ~100 MB
    const turns = 24;
    const noisy = "head -c 2000000 /dev/zero | tr '\\0' a";
    const { report, atifDir } = await episode(
      'tokentraj-chatty',
      (request) => {
        const answered = request.messages.filter((m) => m.role === 'assistant').length;
        const call =
          answered < turns
            ? { id: `n${answered}`, name: 'exec', arguments: JSON.stringify({ command: noisy }) }
            : { id: 'done', name: 'submit', arguments: '{}' };
        return { content: 'w'.repeat(400 * 1024), calls: [call] };
      },
      { tokenIds: false },
    );
    try {
      const recorded = report.trajectory!.flatMap((step) => step.turns ?? []);
      expect(recorded).toHaveLength(turns + 1);
      const requestChars = recorded.reduce((sum, turn) => sum + JSON.stringify(turn.request).length, 0);
      expect(requestChars).toBeLessThan(turns * 2 * 1024 * 1024);
      // and the last request was cut: the records are of a conversation past its cap
      const last = recorded.at(-1)!.request['messages'] as unknown[];
      expect(JSON.stringify(last)).toContain('dropped to keep the conversation bounded');
    } finally {
      await rm(atifDir, { recursive: true, force: true });
    }
  });

  it('fails the episode, naming the field, when the server sends token ids that are not ids', async () => {
    const { report, atifDir } = await episode('tokentraj-bad-ids', (request, response) => {
      const body = {
        choices: [{ message: { role: 'assistant', content: 'x' }, token_ids: ['a', -1] }],
        usage: { prompt_tokens: request.messages.length, completion_tokens: 1 },
      };
      response.setHeader('content-type', 'application/json');
      response.end(JSON.stringify(body));
      return undefined;
    });
    await rm(atifDir, { recursive: true, force: true });
    expect(report.reward).toBe(0);
    expect(report.agentFailure).toMatch(/token_ids/);
  });
});
