import { cp, mkdir, rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHAT_TOOLS } from '../../src/env/index.ts';
import { ENVS, WireClient } from '../../src/platform/wire/index.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { expectCode } from '../support/errors.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';
import { attack } from '../hostile/summary.ts';

const write = (turnText: string) =>
  `${turnText}\n<tool_call>{"name": "write_file", "arguments": {"path": "/app/hello.txt", "content": "hello sandgym\\n"}}</tool_call>`;

/** The chat env served by a node's Envs service: ChatReset and ChatStep, exactly once per turn. */
describe('the chat env over the wire', () => {
  const dataDir = join(TEST_DATA_ROOT, `chat-env-wire-${process.pid}`);
  const taskRoot = join(dataDir, 'tasks');
  let cluster: InProcessCluster;
  let alpha: WireClient<typeof ENVS>;
  let beta: WireClient<typeof ENVS>;

  beforeAll(async () => {
    await mkdir(taskRoot, { recursive: true });
    await cp(resolve('examples/tasks/hello-file'), join(taskRoot, 'hello-file'), { recursive: true });
    cluster = await startInProcessCluster({
      dataDir,
      storeDir: STORE_DIR,
      nodeId: 'chat',
      grants: {},
      envs: { taskRoot },
    });
    const as = (project: string) =>
      new WireClient(`127.0.0.1:${cluster.node.port}`, ENVS, {
        token: IN_PROCESS_NODE_TOKEN,
        metadata: { 'sandgym-project': project },
      });
    alpha = as('alpha');
    beta = as('beta');
  });

  afterAll(async () => {
    alpha?.close();
    beta?.close();
    await cluster?.close();
    await rm(dataDir, { recursive: true, force: true });
  });

  it('opens, runs each turn once (a retry gets its answer again), and grades a task on submit', async () => {
    const { envId } = await alpha.call('Make', { spec: { kind: 'task', path: 'hello-file' } });
    try {
      await expectCode(
        alpha.call('ChatStep', { envId, turn: 0, answer: 'hi' }),
        'failed_precondition',
        /ChatReset first/,
      );
      const opened = await alpha.call('ChatReset', {
        envId,
        options: { episodeId: 'chat-1' },
        chat: { systemPrompt: 'Be brief.', maxTurns: 5, format: 'hermes' },
      });
      expect(opened.messages).toEqual([
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: expect.stringMatching(/hello\.txt/) as unknown },
      ]);
      expect(opened.info).toMatchObject({
        episodeId: 'chat-1',
        tools: JSON.parse(JSON.stringify(CHAT_TOOLS)) as unknown,
      });
      const first = await alpha.call('ChatStep', { envId, turn: 0, answer: write('Writing.'), tokens: 30 });
      expect(first.messages).toEqual([
        { role: 'tool', tool_call_id: 'call_0_0', name: 'write_file', content: 'wrote /app/hello.txt' },
      ]);
      expect(first.info).toMatchObject({ stepIndex: 0, replayed: false, turns: 1, tokens: 30 });
      // the answer was lost: the same turn again is the same result, run once
      const again = await alpha.call('ChatStep', { envId, turn: 0, answer: write('Writing.'), tokens: 30 });
      expect([again.messages, again.info['replayed']]).toEqual([first.messages, true]);
      await expectCode(alpha.call('ChatStep', { envId, turn: 0, answer: 'other' }), 'divergence');
      await expectCode(
        alpha.call('ChatStep', { envId, turn: 5, answer: 'x' }),
        'invalid_argument',
        /next turn is 1/,
      );
      await expectCode(
        alpha.call('Step', { envId, stepIndex: 1, action: { type: 'submit' } }),
        'failed_precondition',
        /chat episode/,
      );
      const done = await alpha.call('ChatStep', {
        envId,
        turn: 1,
        answer: {
          role: 'assistant',
          content: '',
          tool_calls: [{ id: 'fin', type: 'function', function: { name: 'submit', arguments: '{}' } }],
        },
      });
      expect([done.reward, done.terminated, done.outcome]).toEqual([1, true, { kind: 'ok' }]);
      expect(done.info).toMatchObject({
        calls: [{ id: 'fin', name: 'submit', stepIndex: 1 }],
        grade: { reward: 1 },
      });
    } finally {
      await alpha.call('Close', { envId });
    }
  });

  it("keeps a hostile model's answers to observations, and a project's chat to itself", () =>
    attack('model', 'chat env over the wire: huge and malformed answers, another tenant', async () => {
      const { envId } = await alpha.call('Make', {
        spec: { kind: 'sandbox', sandbox: { environment: 'busybox:latest' } },
      });
      try {
        await alpha.call('ChatReset', { envId });
        const huge = await alpha.call('ChatStep', {
          envId,
          turn: 0,
          answer: `<tool_call>${'{'.repeat(5 << 20)}`,
        });
        expect(huge.messages).toEqual([
          { role: 'user', content: expect.stringMatching(/over the 4194304 read/) as unknown },
        ]);
        const shapeless = await alpha.call('ChatStep', {
          envId,
          turn: 1,
          answer: { tool_calls: { all: true } },
        });
        expect(shapeless.messages[0]?.['content']).toMatch(/no assistant message/);
        expect([huge.outcome, shapeless.outcome]).toEqual([{ kind: 'ok' }, { kind: 'ok' }]);
        // another project's client cannot step, or even see, alpha's chat
        await expectCode(beta.call('ChatStep', { envId, turn: 2, answer: 'x' }), 'not_found');
        await expectCode(beta.call('ChatReset', { envId }), 'not_found');
        // the honest twin: alpha's next turn runs
        const honest = await alpha.call('ChatStep', {
          envId,
          turn: 2,
          answer: '{"name": "exec", "parameters": {"command": "echo ok"}}',
        });
        expect(honest.messages[0]?.['content']).toBe('ok\n[exit code 0]');
      } finally {
        await alpha.call('Close', { envId });
      }
    }));

  it('refuses chat options it cannot honour, naming the field', async () => {
    const { envId } = await alpha.call('Make', { spec: { kind: 'sandbox' } });
    try {
      await expectCode(
        alpha.call('ChatReset', { envId, chat: { maxTurns: -1 } }),
        'invalid_argument',
        /maxTurns/,
      );
      await expectCode(
        alpha.call('ChatReset', { envId, chat: { parser: 'eval' } as never }),
        'invalid_argument',
        /parser/,
      );
    } finally {
      await alpha.call('Close', { envId });
    }
  });
});
