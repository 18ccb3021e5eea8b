import { execFile, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backends/index.ts';
import { ModelProxy, type ModelTurn } from '../../src/rollout/index.ts';
import { completionOf, fakeTokens, startFakeModel, type FakeAnswer } from '../support/fake-model.ts';

const CLI = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');
const PYTHON = resolve('.venv/bin/python');
const CLIENT = resolve('test/support/openai_through_proxy.py');

const ANSWER: FakeAnswer = {
  content: 'Listing them now.',
  calls: [{ id: 'call-x', name: 'exec', arguments: '{"command":"ls -la"}' }],
};
const SAID = fakeTokens(`${ANSWER.content}exec{"command":"ls -la"}`);

async function records(dir: string): Promise<ModelTurn[]> {
  const text = await readFile(join(dir, 'turns.jsonl'), 'utf8');
  return text
    .trim()
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as ModelTurn);
}

describe('sandgym proxy', () => {
  let out = '';
  beforeEach(async () => (out = await mkdtemp(join(tmpdir(), 'sandgym-proxy-'))));
  afterEach(() => rm(out, { recursive: true, force: true }));

  it('records the turns of the official openai client, plain and streamed, with token ids and logprobs', async () => {
    await using fake = await startFakeModel(() => ANSWER);
    const child = spawn(
      'node',
      [CLI, 'proxy', '--upstream', fake.baseUrl, '--listen', '127.0.0.1:0', '--out', out],
      { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, SANDGYM_LLM_API_KEY: '' } },
    );
    try {
      let stderr = '';
      const url = await new Promise<string>((found, fail) => {
        child.stderr.on('data', (chunk: Buffer) => {
          stderr += chunk.toString();
          const match = /listening on (\S+),/.exec(stderr);
          if (match) found(match[1]!);
        });
        child.once('exit', () => fail(new Error(`the proxy exited: ${stderr}`)));
      });
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v1$/);
      // not execFileSync: the fake model answers from this process
      const { stdout } = await promisify(execFile)(PYTHON, [CLIENT, url]);
      const got = JSON.parse(stdout) as Record<
        string,
        { content: string; calls: string[][]; usage: number[] }
      >;
      const call = ['call-x', 'exec', '{"command":"ls -la"}'];
      expect(got['plain']).toMatchObject({ content: ANSWER.content, calls: [call] });
      expect(got['streamed']).toMatchObject({ content: ANSWER.content, calls: [call] });
      expect(got['streamed']?.usage).toEqual(got['plain']?.usage);

      child.kill('SIGTERM');
      await new Promise((done) => child.once('exit', done));
      const [plain, streamed] = await records(out);
      for (const turn of [plain, streamed]) {
        expect(turn?.error).toBeUndefined();
        expect(turn?.status).toBe(200);
        // the exact request the client sent, the answer's tokens as the server gave them
        expect(turn?.request['messages']).toEqual([
          { role: 'system', content: 'You are a test.' },
          { role: 'user', content: 'List the files.' },
        ]);
        expect(turn?.request['return_token_ids']).toBe(true);
        expect(turn?.completionTokenIds).toEqual(SAID);
        expect(turn?.logprobs).toEqual(SAID.map((_, i) => (i === 0 ? 0 : -i / 100)));
        expect(turn?.promptTokenIds?.length).toBeGreaterThan(0);
        expect(turn?.toolCalls).toEqual([{ id: 'call-x', name: 'exec', arguments: '{"command":"ls -la"}' }]);
        expect(turn?.usage).toEqual({ promptTokens: got['plain']!.usage[0], completionTokens: SAID.length });
      }
      expect(streamed?.request['stream']).toBe(true);
      // the client's key went upstream (no key of the proxy's own), and into no record
      expect(JSON.stringify([plain, streamed])).not.toContain('client-key-not-for-records');
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('cuts off a stream that never ends at its time limit, and says so in the record', async () => {
    await using fake = await startFakeModel((request, response) => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      response.write(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'and' } }] })}\n\n`);
      return undefined; // and never more
    });
    await using proxy = await ModelProxy.start({
      upstream: fake.baseUrl,
      outDir: out,
      answerTimeoutMs: 1000,
    });
    const response = await fetch(`${proxy.url}/chat/completions`, {
      method: 'POST',
      body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true }),
    });
    expect(response.status).toBe(200);
    // the client sees the stream break, never a clean end
    await expect(response.text()).rejects.toThrow();
    await proxy.close();
    const [turn] = await records(out);
    expect(turn?.error).toMatch(/did not finish its answer within 1000 ms/);
    expect(turn?.response).toMatchObject({ choices: [{ message: { content: 'and' } }] });
  });

  it('answers 502 for an answer past the size cap, and passes a misshapen one through, recorded as such', async () => {
    let mode = 'huge';
    await using fake = await startFakeModel((request, response) => {
      response.setHeader('content-type', 'application/json');
      if (mode === 'huge') response.end(`{"pad":"${'x'.repeat(17 * 1024 * 1024)}"}`);
      else {
        const body = completionOf(request, { content: 'ok' }) as { usage: Record<string, unknown> };
        body.usage['prompt_tokens'] = -5;
        response.end(JSON.stringify(body));
      }
      return undefined;
    });
    await using proxy = await ModelProxy.start({ upstream: fake.baseUrl, outDir: out });
    const ask = () =>
      fetch(`${proxy.url}/chat/completions`, {
        method: 'POST',
        body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
      });
    const huge = await ask();
    expect(huge.status).toBe(502);
    expect(await huge.text()).toMatch(/larger than 16777216 bytes/);
    mode = 'negative';
    const negative = await ask();
    expect(negative.status).toBe(200);
    expect(((await negative.json()) as { usage: { prompt_tokens: number } }).usage.prompt_tokens).toBe(-5);
    await proxy.close();
    const [first, second] = await records(out);
    expect(first?.error).toMatch(/larger than/);
    expect(second?.error).toMatch(/usage\.prompt_tokens/);
    expect(second?.usage).toBeUndefined();
  });

  it('relays a stream of junk chunks unchanged, and records what was wrong with it', async () => {
    const junk = [
      'data: {not json\n\n',
      `data: ${JSON.stringify({ choices: 'all of them' })}\n\n`,
      `data: ${JSON.stringify({ choices: [{ index: 1e9, delta: { content: 'x' } }] })}\n\n`,
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: 'kept', tool_calls: [{ index: -1 }] } }] })}\n\n`,
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, token_ids: ['a'] }] })}\n\n`,
    ].join('');
    await using fake = await startFakeModel((_request, response) => {
      response.writeHead(200, { 'content-type': 'text/event-stream' });
      response.end(junk);
      return undefined;
    });
    await using proxy = await ModelProxy.start({ upstream: fake.baseUrl, outDir: out });
    const response = await fetch(`${proxy.url}/chat/completions`, {
      method: 'POST',
      body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true }),
    });
    expect(await response.text()).toBe(junk);
    await proxy.close();
    const [turn] = await records(out);
    expect(turn?.error).toMatch(/chunk 1 is not JSON/);
    expect(turn?.error).toMatch(/choices is not a list/);
    expect(turn?.error).toMatch(/names choice 1000000000/);
    expect(turn?.error).toMatch(/names tool call -1/);
    expect(turn?.error).toMatch(/without \[DONE\]/);
    expect(turn?.error).toMatch(/token_ids/);
    expect(turn?.completionTokenIds).toBeUndefined();
  });

  it('refuses requests that are not chat completions, naming what is wrong', async () => {
    await using fake = await startFakeModel(() => ANSWER);
    await using proxy = await ModelProxy.start({ upstream: fake.baseUrl, outDir: out });
    const post = (body: string) => fetch(`${proxy.url}/chat/completions`, { method: 'POST', body });
    const notJson = await post('{"model":');
    expect(notJson.status).toBe(400);
    expect(await notJson.text()).toMatch(/not JSON/);
    const noMessages = await post(JSON.stringify({ model: 'm', messages: [] }));
    expect(await noMessages.text()).toMatch(/at least one message/);
    expect((await fetch(`${proxy.url}/models`)).status).toBe(404);
    expect(fake.requests).toHaveLength(0);
  });

  it('listens on loopback only', async () => {
    for (const host of ['0.0.0.0', '::', '10.0.0.1'])
      await expect(
        ModelProxy.start({ upstream: 'http://127.0.0.1:1/v1', outDir: out, host }),
      ).rejects.toThrow(/loopback only/);
    await using proxy = await ModelProxy.start({
      upstream: 'http://127.0.0.1:1/v1',
      outDir: out,
      host: '::1',
    });
    expect(proxy.url).toMatch(/^http:\/\/\[::1\]:\d+\/v1$/);
  });
});
