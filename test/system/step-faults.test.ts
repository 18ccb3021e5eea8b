import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { SandboxEnv, type SandboxAction } from '../../src/env/index.ts';
import { Platform, type RemotePlatform } from '../../src/platform/index.ts';
import { NODE_TOKEN, startLoneNode, type LoneNode, type NodeProcess } from '../support/cluster.ts';

const FIRST: SandboxAction = { type: 'exec', command: 'echo first >> /root/count' };
/** The step that is cut: it leaves a mark as it starts, and adds a line when it ends. */
const CUT: SandboxAction = { type: 'exec', command: 'touch /root/started; sleep 1; echo cut >> /root/count' };
const STEP_CLIENT = join(import.meta.dirname, '..', 'support', 'step-client.mjs');

/**
 * Exactly once, proved by killing the node agent and the client at every point of a step (the
 * fault points of SandboxSteps and SandboxEnv), then asking for the step again.
 */
describe('a step killed at every point', () => {
  const tag = randomBytes(2).toString('hex');
  let lone: LoneNode | undefined;
  let node: NodeProcess;
  let client: RemotePlatform;

  beforeAll(async () => {
    lone = await startLoneNode(`s${tag}`, 230, 7600, ['--warm-pool', '0']);
    node = lone.node;
    client = await Platform.connect(`grpc://${node.address}`, { token: NODE_TOKEN });
  });

  afterAll(async () => {
    await client?.close().catch(() => undefined);
    await lone?.remove();
  });

  /** An episode whose first step ran; the next one is CUT. */
  async function episode(): Promise<SandboxEnv> {
    const env = SandboxEnv.create(client, { sandbox: { environment: 'busybox:latest' } });
    await env.reset();
    expect((await env.step(FIRST)).observation).toMatchObject({ exitCode: 0 });
    return env;
  }

  async function count(env: SandboxEnv): Promise<string> {
    return (await env.current!.exec(['cat', '/root/count'])).stdout;
  }

  const outcomes = {
    // never started: the retry runs it
    'step.before-intent': { inDoubt: false, ran: false },
    // started, but its command never ran: nobody can know that from outside, so it is in doubt
    'step.after-intent': { inDoubt: true, ran: false },
    'step.after-action': { inDoubt: true, ran: true },
    // recorded: the retry answers with the record
    'step.after-record': { inDoubt: false, ran: true },
  } as const;

  for (const [point, expected] of Object.entries(outcomes)) {
    it(`node killed at ${point}`, async () => {
      await node.stop();
      await node.restart({ SANDGYM_FAULT_POINTS: `${point}@2` });
      await client.ready();
      await using env = await episode();
      const cut = await env.step(CUT);
      expect(cut.outcome).toMatchObject({ kind: 'infra_failure', reason: 'node_lost' });
      expect(cut.info.stepIndex).toBe(1);
      expect(env.nextStepIndex, 'a step with no answer keeps its index').toBe(1);
      await node.restart(); // adopts the sandbox and its log
      await client.ready();
      expect(await count(env)).toBe(expected.ran ? 'first\ncut\n' : 'first\n');
      const retry = await env.step(CUT).then(
        (result) => ({ result }),
        (error: unknown) => ({ error }),
      );
      if (expected.inDoubt) {
        expect('error' in retry && isSandgymError(retry.error, 'step_in_doubt')).toBe(true);
        // asking again does not settle it, and never runs the command
        await expect(env.step(CUT)).rejects.toThrow(/may or may not have taken effect/);
        expect(await count(env)).toBe(expected.ran ? 'first\ncut\n' : 'first\n');
      } else {
        expect('result' in retry && retry.result.info).toMatchObject({
          stepIndex: 1,
          replayed: expected.ran,
        });
        expect(await count(env)).toBe('first\ncut\n');
      }
    });
  }

  /** Runs the step client on the episode; resolves with its exit and its output lines. */
  function stepClient(
    env: SandboxEnv,
    faultPoints: string | undefined,
    onStarted?: (kill: () => void) => Promise<void>,
  ): Promise<{ signal: string | null; lines: string[] }> {
    const child = spawn(
      process.execPath,
      [
        STEP_CLIENT,
        `grpc://${node.address}`,
        NODE_TOKEN,
        env.current!.id,
        env.episode,
        JSON.stringify(FIRST),
        JSON.stringify(CUT),
      ],
      {
        env: { ...process.env, ...(faultPoints ? { SANDGYM_FAULT_POINTS: faultPoints } : {}) },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<{ signal: string | null; lines: string[] }>((resolve) =>
      child.once('exit', (_code, signal) => resolve({ signal, lines: output.split('\n').filter(Boolean) })),
    );
    if (onStarted) void onStarted(() => child.kill('SIGKILL'));
    return exited;
  }

  it('client killed before it sends the step: the next client runs it, once', async () => {
    await using env = await episode();
    // the client's second step (its replay of FIRST is the first) dies before the call
    const { signal, lines } = await stepClient(env, 'env.before-step@2');
    expect(signal).toBe('SIGKILL');
    expect(lines.map((line) => JSON.parse(line) as { replayed: boolean })).toEqual([
      expect.objectContaining({ replayed: true }),
    ]);
    const retry = await env.step(CUT);
    expect(retry.info.replayed).toBe(false);
    expect(await count(env)).toBe('first\ncut\n');
  });

  it('client killed while its step runs: the next client waits for that run, not a second one', async () => {
    await using env = await episode();
    const killed = stepClient(env, undefined, async (kill) => {
      // the step is on the node once its command left its mark
      while ((await env.current!.exec(['test', '-e', '/root/started'])).exitCode !== 0);
      kill();
    });
    expect((await killed).signal).toBe('SIGKILL');
    const retry = await env.step(CUT);
    expect(retry.info.replayed).toBe(true);
    expect(retry.observation).toMatchObject({ type: 'exec', exitCode: 0 });
    expect(await count(env)).toBe('first\ncut\n');
  });

  it('client killed after the answer: the next client gets the record', async () => {
    await using env = await episode();
    const { signal } = await stepClient(env, 'env.step-answered@2');
    expect(signal).toBe('SIGKILL');
    const retry = await env.step(CUT);
    expect(retry.info.replayed).toBe(true);
    expect(await count(env)).toBe('first\ncut\n');
  });
});
