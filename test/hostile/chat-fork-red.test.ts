import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { Platform } from '../../src/platform/index.ts';
import { ENVS, NODE, PROJECT_KEY, WireClient } from '../../src/platform/wire/index.ts';
import { NODE_TOKEN, startLoneNode, type LoneNode } from '../support/cluster.ts';
import { expectCode } from '../support/errors.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';
import { attack } from './summary.ts';

const BUSYBOX = { kind: 'sandbox', sandbox: { environment: 'busybox:latest' } } as const;
const TOKENS = {
  alpha: 'alpha-fork-token-7c2e9a4b1d3f5068',
  beta: 'beta-fork-token-3e5a7c9b2d4f6081',
  carol: 'carol-fork-token-9a1c3e5b7d2f4860',
  dave: 'dave-fork-token-5b7d9f1a3c2e4068',
  erin: 'erin-fork-token-1d3f5a7c9e2b4068',
};
/**
 * Each project may hold 3 sandboxes (an env counts as one). Each attack through the controller
 * has projects of its own: the controller learns of closed envs at its next poll of the node.
 */
const GRANTS = {
  [TOKENS.alpha]: { project: 'alpha', maxSandboxes: 3 },
  [TOKENS.beta]: { project: 'beta', maxSandboxes: 3 },
  [TOKENS.carol]: { project: 'carol', maxSandboxes: 3 },
  [TOKENS.dave]: { project: 'dave', maxSandboxes: 3 },
  [TOKENS.erin]: { project: 'erin', maxSandboxes: 3 },
};
const VENV_PYTHON = resolve('.venv/bin/python');

/**
 * A tenant's Python: a lead chat env forked 4 ways where its quota holds 3 (the lead and 2
 * forks), then 2 ways (retried while the controller has yet to see the first fork's envs go),
 * everything closed at the end. Prints what each fork came to.
 */
const PYTHON_FORKS = `
import os, time
from sandgym import Platform, SandgymError
from sandgym.chat import ChatEnv
platform = Platform.connect(os.environ["SANDGYM_URL"], os.environ["SANDGYM_TOKEN"])
spec = {"kind": "sandbox", "sandbox": {"environment": "busybox:latest"}}
lead = ChatEnv(platform, spec, instruction="fork me")
forks = []
try:
    lead.reset()
    try:
        forks = lead.fork(4)
        print("forked 4")
    except SandgymError as error:
        print("refused", error.code)
    for attempt in range(100):
        try:
            forks = lead.fork(2)
            print("forked 2")
            break
        except SandgymError as error:
            if error.code != "resource_exhausted":
                raise
            time.sleep(0.1)
finally:
    for env in [lead, *forks]:
        env.close()
`;

/**
 * Two tasks on busybox. `fork-gift`'s environment already holds the file `fork-plain`'s tests
 * look for, and its agent has an hour; `fork-plain`'s agent has two minutes and starts without it.
 */
const TASKS: Record<string, { dockerfile: string; agentTimeoutSec: number; instruction: string }> = {
  'fork-gift': {
    dockerfile:
      'FROM busybox:latest\nRUN mkdir -p /app && echo "hello fork" > /app/hello.txt\nWORKDIR /app\n',
    agentTimeoutSec: 3600,
    instruction: 'Look around /app.',
  },
  'fork-plain': {
    dockerfile: 'FROM busybox:latest\nRUN mkdir -p /app\nWORKDIR /app\n',
    agentTimeoutSec: 120,
    instruction: 'Create /app/hello.txt holding the line `hello fork`.',
  },
  // as fork-plain, each environment its own: a node that probed one has not probed the others
  ...Object.fromEntries(
    [1, 2].map((n) => [
      `fork-cold-${n}`,
      {
        dockerfile: `FROM busybox:latest\nRUN mkdir -p /app && echo ${n} > /app/n\nWORKDIR /app\n`,
        agentTimeoutSec: 120,
        instruction: 'Create /app/hello.txt holding the line `hello fork`.',
      },
    ]),
  ),
};
const TEST_SH =
  '#!/bin/sh\nif [ "$(cat /app/hello.txt 2>/dev/null)" = "hello fork" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n';

async function writeTask(root: string, name: string): Promise<void> {
  const task = TASKS[name]!;
  const dir = join(root, name);
  await mkdir(join(dir, 'environment'), { recursive: true });
  await mkdir(join(dir, 'tests'), { recursive: true });
  await mkdir(join(dir, 'solution'), { recursive: true });
  await writeFile(join(dir, 'environment', 'Dockerfile'), task.dockerfile);
  await writeFile(join(dir, 'instruction.md'), `${task.instruction}\n`);
  await writeFile(join(dir, 'tests', 'test.sh'), TEST_SH, { mode: 0o755 });
  await writeFile(join(dir, 'solution', 'solve.sh'), '#!/bin/sh\necho "hello fork" > /app/hello.txt\n', {
    mode: 0o755,
  });
  await writeFile(
    join(dir, 'task.toml'),
    `[verifier]\ntimeout_sec = 30\n\n[agent]\ntimeout_sec = ${task.agentTimeoutSec}\n\n[environment]\nmemory_mb = 256\n`,
  );
}

/**
 * A tenant's asyncio loop: a lead chat env forked 2 ways (sandgym.aio), the fork cancelled
 * (`asyncio.wait_for` around a rollout, a trainer stopping) once both forks' ChatRestore calls
 * are on the wire, or, with CANCEL unset, left to finish; then the lead, and any fork it gave,
 * closed. Prints how the fork ended.
 */
const PYTHON_CANCELLED_FORK = `
import asyncio, os
from sandgym.aio import ChatEnv, Platform

async def main():
    platform = await Platform.connect(os.environ["SANDGYM_URL"], os.environ["SANDGYM_TOKEN"])
    lead = ChatEnv(platform, {"kind": "sandbox", "sandbox": {"environment": "busybox:latest"}}, instruction="fork me")
    await lead.reset()
    wire, real, restoring = platform._wire, platform._wire.call, []
    both_sent = asyncio.Event()

    async def watched(service, method, request, *args, **kwargs):
        if method == "ChatRestore":
            restoring.append(request["envId"])
            if len(restoring) == 2:
                both_sent.set()
        return await real(service, method, request, *args, **kwargs)

    wire.call = watched
    fork = asyncio.create_task(lead.fork(2))
    forks = []
    if os.environ.get("CANCEL"):
        await both_sent.wait()
        fork.cancel()
    try:
        forks = await fork
        print("forked")
    except asyncio.CancelledError:
        print("cancelled")
    wire.call = real
    for env in [lead, *forks]:
        await env.close()

asyncio.run(main())
`;

/** A model's answer that runs `command` in the sandbox. */
const exec = (command: string) =>
  `<tool_call>{"name":"exec","arguments":{"command":${JSON.stringify(command)}}}</tool_call>`;
const SUBMIT = '<tool_call>{"name":"submit","arguments":{}}</tool_call>';

type Envs = WireClient<typeof ENVS>;

/**
 * Forks of chat episodes (Envs.Checkpoint with a depth, Envs.ChatRestore, Envs.Make beside)
 * under hostile tenants: a tenant controls every field of its requests, and several projects
 * share the node and the controller. `it.fails` with `OPEN BREAK:` marks an attack that works
 * today: the safe outcome is asserted, so the day it holds the test fails and becomes a plain `it`.
 */
describe('forks of chat episodes under hostile tenants', () => {
  const dataDir = join(TEST_DATA_ROOT, `chat-fork-red-${randomBytes(3).toString('hex')}`);
  const taskRoot = join(dataDir, 'tasks');
  let cluster: InProcessCluster;
  const clients: { close(): void }[] = [];
  /** A project's client of the node itself (the node token naming the project). */
  let node: (project: string) => Envs;
  /** A project's client of the controller (its project token). */
  let controller: (token: string) => Envs;

  beforeAll(async () => {
    for (const name of Object.keys(TASKS)) await writeTask(taskRoot, name);
    cluster = await startInProcessCluster({
      dataDir,
      storeDir: STORE_DIR,
      nodeId: 'rfork',
      grants: GRANTS,
      envs: { taskRoot },
    });
    node = (project) => {
      const client = new WireClient(`127.0.0.1:${cluster.node.port}`, ENVS, {
        token: IN_PROCESS_NODE_TOKEN,
        metadata: { [PROJECT_KEY]: project },
      });
      clients.push(client);
      return client;
    };
    controller = (token) => {
      const client = new WireClient(`127.0.0.1:${cluster.controller.port}`, ENVS, { token });
      clients.push(client);
      return client;
    };
  });

  afterAll(async () => {
    for (const client of clients) client.close();
    await cluster?.close();
    await rm(dataDir, { recursive: true, force: true });
  });

  /** Makes envs through `envs`, runs `use` with a maker, and closes every env made, whatever happens. */
  async function withEnvs(
    envs: Envs,
    use: (make: (request: Parameters<Envs['call']>[1]) => Promise<string>) => Promise<void>,
  ) {
    const made: string[] = [];
    try {
      await use(async (request) => {
        const { envId } = await envs.call('Make', request);
        made.push(envId);
        return envId;
      });
    } finally {
      for (const envId of made) await envs.call('Close', { envId }).catch(() => undefined);
    }
  }

  /**
   * What a model gets past an ended turn budget through a fork: ChatRestore of a checkpoint made
   * after max_turns ended the episode, then one more turn. Undefined when either is refused.
   */
  async function turnPastTheLimit(envs: Envs, forkId: string, checkpointId: string, turn: number) {
    const restored = await envs.call('ChatRestore', { envId: forkId, checkpointId }).catch(() => undefined);
    if (!restored) return undefined;
    const stepped = await envs
      .call('ChatStep', { envId: forkId, turn, answer: exec('echo past-the-limit') })
      .catch(() => undefined);
    if (!stepped) return undefined;
    // what ran: a call with a step index ran in the sandbox
    const calls = (stepped.info as { calls: { stepIndex?: number }[] }).calls;
    return {
      ran: calls.some((c) => c.stepIndex !== undefined),
      turns: (stepped.info as { turns: number }).turns,
    };
  }

  it('CLOSED: a fork of a chat episode its turn limit ended goes on past max_turns', () =>
    attack('tenant', 'fork a chat episode after max_turns ended it', () =>
      withEnvs(node('solo'), async (make) => {
        const envs = node('solo');
        const lead = await make({ spec: BUSYBOX });
        await envs.call('ChatReset', { envId: lead, chat: { maxTurns: 1 } });
        const only = await envs.call('ChatStep', { envId: lead, turn: 0, answer: exec('echo 0') });
        expect([only.truncated, only.info['truncatedBy']]).toEqual([true, 'turn_limit']);
        // ended: the lead itself takes no other turn
        await expectCode(
          envs.call('ChatStep', { envId: lead, turn: 1, answer: exec('echo 1') }),
          'failed_precondition',
        );
        // a checkpoint of the ended episode, forked: a live episode again, one turn over its budget
        const { checkpointId } = await envs.call('Checkpoint', { envId: lead, depth: 'disk' });
        const fork = await make({ spec: BUSYBOX, beside: lead });
        const past = await turnPastTheLimit(envs, fork, checkpointId, 1);
        // and again from the fork, chained: as many turns as the tenant forks
        expect(past).toBeUndefined();
      }),
    ));

  it('honest twin: a fork made before the turn limit counts its turns on, and ends at the limit', () =>
    withEnvs(node('solo'), async (make) => {
      const envs = node('solo');
      const lead = await make({ spec: BUSYBOX });
      await envs.call('ChatReset', { envId: lead, chat: { maxTurns: 2 } });
      const first = await envs.call('ChatStep', {
        envId: lead,
        turn: 0,
        answer: exec('echo lead > /root/f'),
      });
      expect(first.truncated).toBe(false);
      const { checkpointId } = await envs.call('Checkpoint', { envId: lead, depth: 'disk' });
      const fork = await make({ spec: BUSYBOX, beside: lead });
      const opened = await envs.call('ChatRestore', { envId: fork, checkpointId });
      expect(opened.info['turns']).toBe(1);
      const last = await envs.call('ChatStep', { envId: fork, turn: 1, answer: exec('cat /root/f') });
      expect(last.messages[0]!['content']).toMatch(/lead/);
      expect([last.truncated, last.info['turns']]).toEqual([true, 2]);
      await expectCode(
        envs.call('ChatStep', { envId: fork, turn: 2, answer: exec('echo 2') }),
        'failed_precondition',
      );
    }));

  it("CLOSED: a task's checkpoint forked into another task's env is graded as that task", () =>
    attack('tenant', "fork one task's checkpoint into another task's env", () =>
      withEnvs(node('solo'), async (make) => {
        const envs = node('solo');
        // the gift task: its environment holds what the plain task's tests want, and an hour
        const gift = await make({ spec: { kind: 'task', path: 'fork-gift' } });
        await envs.call('ChatReset', { envId: gift });
        const { checkpointId } = await envs.call('Checkpoint', { envId: gift, depth: 'disk' });
        const plain = await make({ spec: { kind: 'task', path: 'fork-plain' }, beside: gift });
        // an episode of its own first: the node has probed the plain task's environment (see the
        // node-crash attack below for a fork into a task env the node never probed)
        await envs.call('ChatReset', { envId: plain });
        const restored = await envs
          .call('ChatRestore', { envId: plain, checkpointId })
          .catch((error: unknown) => {
            if (isSandgymError(error)) return undefined;
            throw error;
          });
        if (!restored) return; // refused: the safe outcome
        const info = restored.info as {
          task: string;
          agentTimeoutMs: number;
          restoredFrom: { budgetLeftMs: number };
        };
        expect(info.task).toBe('fork-plain');
        // no more agent time than the plain task gives
        const budgetKept = info.restoredFrom.budgetLeftMs <= info.agentTimeoutMs;
        // not one step of work, and submitted: the plain task's tests ran on the gift's files
        const submitted = await envs.call('ChatStep', { envId: plain, turn: 0, answer: SUBMIT });
        expect(submitted.terminated).toBe(true);
        expect({ reward: submitted.reward, budgetKept }).toEqual({ reward: 0, budgetKept: true });
      }),
    ));

  it("honest twin: the plain task's own fork starts from its own files, and earns nothing undone", () =>
    withEnvs(node('solo'), async (make) => {
      const envs = node('solo');
      const plain = await make({ spec: { kind: 'task', path: 'fork-plain' } });
      await envs.call('ChatReset', { envId: plain });
      const { checkpointId } = await envs.call('Checkpoint', { envId: plain, depth: 'disk' });
      const fork = await make({ spec: { kind: 'task', path: 'fork-plain' }, beside: plain });
      const restored = await envs.call('ChatRestore', { envId: fork, checkpointId });
      const info = restored.info as { agentTimeoutMs: number; restoredFrom: { budgetLeftMs: number } };
      expect(info.restoredFrom.budgetLeftMs).toBeLessThanOrEqual(info.agentTimeoutMs);
      const submitted = await envs.call('ChatStep', { envId: fork, turn: 0, answer: SUBMIT });
      expect([submitted.terminated, submitted.reward]).toEqual([true, 0]);
    }));

  /**
   * Two branches of one checkpoint of the plain task, named `names`: the second does the task,
   * the first nothing; each is checkpointed (the first, then the second), and the first's
   * checkpoint is forked and submitted. What that fork earns is the first branch's work: 0.
   */
  async function firstBranchEarns(names: [string, string]): Promise<number> {
    let reward = Number.NaN;
    await withEnvs(node('solo'), async (make) => {
      const envs = node('solo');
      const task = { kind: 'task', path: 'fork-plain' } as const;
      const lead = await make({ spec: task });
      await envs.call('ChatReset', { envId: lead });
      const group = (await envs.call('Checkpoint', { envId: lead, depth: 'disk' })).checkpointId;
      const [idle, worker] = [
        await make({ spec: task, beside: lead }),
        await make({ spec: task, beside: lead }),
      ];
      await envs.call('ChatRestore', { envId: idle, checkpointId: group, options: { episodeId: names[0] } });
      await envs.call('ChatRestore', {
        envId: worker,
        checkpointId: group,
        options: { episodeId: names[1] },
      });
      await envs.call('ChatStep', {
        envId: worker,
        turn: 0,
        answer: exec('echo "hello fork" > /app/hello.txt'),
      });
      const idleSaved = await envs.call('Checkpoint', { envId: idle, depth: 'disk' });
      await envs.call('Checkpoint', { envId: worker, depth: 'disk' });
      const again = await make({ spec: task, beside: lead });
      await envs.call('ChatRestore', { envId: again, checkpointId: idleSaved.checkpointId });
      const submitted = await envs.call('ChatStep', { envId: again, turn: 0, answer: SUBMIT });
      expect(submitted.terminated).toBe(true);
      reward = submitted.reward;
    });
    return reward;
  }

  it("CLOSED: branches whose names share 64 characters share their checkpoints: one's fork gets the other's work", () =>
    attack(
      'tenant',
      'fork a checkpoint overwritten by a sibling branch of the same name prefix',
      async () => {
        // a trainer's long names (run, step, group, sample): a task checkpoint is stored as
        // environment version `${episodeId}-${n}` cut at 64 characters, so these two are one
        const prefix = 'grpo-run-2026-12-07-step-000123-group-0042-of-0064-sample'.padEnd(64, '-');
        expect(await firstBranchEarns([`${prefix}0`, `${prefix}1`])).toBe(0);
      },
    ));

  it('honest twin: branches with short names keep their own checkpoints', async () => {
    expect(await firstBranchEarns(['sample-0', 'sample-1'])).toBe(0);
  });

  it('holds: a Python fork cut short by the quota keeps none of its envs', () =>
    attack('tenant', 'leak envs through a fork that fails midway', async () => {
      const { stdout } = await promisify(execFile)(VENV_PYTHON, ['-c', PYTHON_FORKS], {
        env: {
          ...process.env,
          PYTHONPATH: resolve('python'),
          SANDGYM_URL: cluster.url,
          SANDGYM_TOKEN: TOKENS.dave,
        },
        timeout: 300_000,
      });
      expect(stdout.trim().split('\n')).toEqual(['refused resource_exhausted', 'forked 2']);
      // the node holds nothing of dave's: no sandbox, no env waiting for one
      const status = new WireClient(`127.0.0.1:${cluster.node.port}`, NODE, { token: IN_PROCESS_NODE_TOKEN });
      clients.push(status);
      expect((await status.call('Status', {})).projects['dave'] ?? 0).toBe(0);
    }));

  /** How the asyncio fork ended, and what the node holds of erin's after it. */
  async function asyncFork(cancel: boolean): Promise<[string, number]> {
    const { stdout } = await promisify(execFile)(VENV_PYTHON, ['-c', PYTHON_CANCELLED_FORK], {
      env: {
        ...process.env,
        PYTHONPATH: resolve('python'),
        SANDGYM_URL: cluster.url,
        SANDGYM_TOKEN: TOKENS.erin,
        ...(cancel ? { CANCEL: '1' } : {}),
      },
      timeout: 300_000,
    });
    const status = new WireClient(`127.0.0.1:${cluster.node.port}`, NODE, { token: IN_PROCESS_NODE_TOKEN });
    clients.push(status);
    return [stdout.trim(), (await status.call('Status', {})).projects['erin'] ?? 0];
  }

  it('honest twin: an asyncio fork that finishes leaves nothing once its envs are closed', async () => {
    expect(await asyncFork(false)).toEqual(['forked', 0]);
  });

  it('CLOSED: an asyncio fork cancelled midway leaves its envs on the node, held against the quota', () =>
    attack('tenant', 'leak envs through a cancelled asyncio fork', async () => {
      const [ended, held] = await asyncFork(true);
      expect(ended).toBe('cancelled');
      // the forks' envs were made: nothing closes them but the idle reaper, 30 minutes on
      expect(held).toBe(0);
    }));

  it('holds: a memory checkpoint of a chat episode restores into no other env', () =>
    attack('tenant', 'fork a memory checkpoint into another env', () =>
      withEnvs(node('solo'), async (make) => {
        const envs = node('solo');
        const lead = await make({ spec: BUSYBOX });
        await envs.call('ChatReset', { envId: lead });
        await envs.call('ChatStep', { envId: lead, turn: 0, answer: exec('echo lead > /root/f') });
        const memory = await envs.call('Checkpoint', { envId: lead, depth: 'memory' });
        expect(memory.depth).toBe('memory');
        const { checkpointId } = memory;
        const fork = await make({ spec: BUSYBOX, beside: lead });
        // a fork with no sandbox yet, and one with a sandbox of its own: neither is the lead's
        await expectCode(envs.call('ChatRestore', { envId: fork, checkpointId }), 'failed_precondition');
        await envs.call('ChatReset', { envId: fork });
        await expectCode(envs.call('ChatRestore', { envId: fork, checkpointId }), 'failed_precondition');
        await expectCode(envs.call('Restore', { envId: fork, checkpointId }), 'failed_precondition');
        // the honest twin: in place, in the lead, the episode goes on from turn 1
        const back = await envs.call('ChatRestore', { envId: lead, checkpointId });
        expect(back.info['turns']).toBe(1);
        const read = await envs.call('ChatStep', { envId: lead, turn: 1, answer: exec('cat /root/f') });
        expect(read.messages[0]!['content']).toMatch(/lead/);
      }),
    ));

  it('holds: hostile ChatRestore and Make-beside requests are refused, and the node goes on', () =>
    attack('tenant', 'hostile ChatRestore and Make beside fields', () =>
      withEnvs(node('solo'), async (make) => {
        const envs = node('solo');
        const lead = await make({ spec: BUSYBOX });
        // a checkpoint made outside a chat episode is no chat episode's
        await envs.call('Reset', { envId: lead });
        const plainCheckpoint = (await envs.call('Checkpoint', { envId: lead, depth: 'disk' })).checkpointId;
        await expectCode(
          envs.call('ChatRestore', { envId: lead, checkpointId: plainCheckpoint }),
          'failed_precondition',
          /not made in a chat episode/,
        );
        // a sandbox env's chat checkpoint is no task env's
        await envs.call('ChatReset', { envId: lead });
        const chatCheckpoint = (await envs.call('Checkpoint', { envId: lead, depth: 'disk' })).checkpointId;
        const task = await make({ spec: { kind: 'task', path: 'fork-plain' } });
        await expectCode(
          envs.call('ChatRestore', { envId: task, checkpointId: chatCheckpoint }),
          'not_found',
        );
        // branch names that are no episode ids (episode ids are free text, named in no path)
        for (const episodeId of ['', 'a'.repeat(257), 'x\0y'])
          await expectCode(
            envs.call('ChatRestore', { envId: lead, checkpointId: chatCheckpoint, options: { episodeId } }),
            'invalid_argument',
          );
        await expectCode(
          envs.call('ChatRestore', { envId: lead, checkpointId: 'ckpt-0000000000000000' }),
          'not_found',
        );
        await expectCode(
          envs.call('ChatRestore', { envId: lead, checkpointId: 'env-rfork-aaaaaaaaaaaa' }),
          'invalid_argument',
        );
        // beside: an env no one made, an id of another kind, an env of a node no one serves
        await expectCode(envs.call('Make', { spec: BUSYBOX, beside: 'env-rfork-aaaaaaaaaaaa' }), 'not_found');
        await expectCode(
          envs.call('Make', { spec: BUSYBOX, beside: 'sg-rfork-aaaaaaaaaaaa' }),
          'invalid_argument',
        );
        await expectCode(
          envs.call('Make', { spec: BUSYBOX, beside: 'env-nowhere-aaaaaaaaaaaa' }),
          'not_found',
        );
        // the honest twin: the same env, its own chat checkpoint, a named branch
        const opened = await envs.call('ChatRestore', {
          envId: lead,
          checkpointId: chatCheckpoint,
          options: { episodeId: 'red-fork-branch' },
        });
        expect(opened.info['episodeId']).toBe('red-fork-branch');
      }),
    ));

  it("holds: through the controller, one project forks nothing of another's, and keeps its quota", () =>
    attack('tenant', "fork another project's env or checkpoint through the controller", async () => {
      const alpha = controller(TOKENS.alpha);
      const beta = controller(TOKENS.beta);
      await withEnvs(alpha, async (makeAlpha) => {
        const lead = await makeAlpha({ spec: BUSYBOX });
        await alpha.call('ChatReset', { envId: lead });
        await alpha.call('ChatStep', { envId: lead, turn: 0, answer: exec('echo alpha-secret > /root/s') });
        const { checkpointId } = await alpha.call('Checkpoint', { envId: lead, depth: 'disk' });
        await withEnvs(beta, async (makeBeta) => {
          // placed beside alpha's env: refused as an env beta never made
          await expectCode(beta.call('Make', { spec: BUSYBOX, beside: lead }), 'not_found');
          const own = await makeBeta({ spec: BUSYBOX });
          await expectCode(beta.call('ChatRestore', { envId: own, checkpointId }), 'not_found');
          await expectCode(beta.call('ChatRestore', { envId: lead, checkpointId }), 'not_found');
          await expectCode(beta.call('Checkpoint', { envId: lead, depth: 'disk' }), 'not_found');
          // the refused Make took none of beta's quota of 3: two more, then no more
          await makeBeta({ spec: BUSYBOX });
          await makeBeta({ spec: BUSYBOX });
          await expectCode(beta.call('Make', { spec: BUSYBOX }), 'resource_exhausted');
        });
        // the honest twin: alpha's own fork has alpha's files
        const fork = await makeAlpha({ spec: BUSYBOX, beside: lead });
        await alpha.call('ChatRestore', { envId: fork, checkpointId });
        const read = await alpha.call('ChatStep', { envId: fork, turn: 1, answer: exec('cat /root/s') });
        expect(read.messages[0]!['content']).toMatch(/alpha-secret/);
      });
    }));

  it("holds: forks made at once count against the project's quota", () =>
    attack('tenant', 'exceed the quota with forks made at once', () =>
      withEnvs(controller(TOKENS.carol), async (make) => {
        const carol = controller(TOKENS.carol);
        const lead = await make({ spec: BUSYBOX });
        await carol.call('ChatReset', { envId: lead });
        const { checkpointId } = await carol.call('Checkpoint', { envId: lead, depth: 'disk' });
        const tries = await Promise.allSettled(
          Array.from({ length: 6 }, async () => {
            const fork = await make({ spec: BUSYBOX, beside: lead });
            await carol.call('ChatRestore', { envId: fork, checkpointId });
            return fork;
          }),
        );
        const made = tries.filter((t) => t.status === 'fulfilled');
        const refused = tries.flatMap((t) =>
          t.status === 'rejected' ? [t.reason as { code?: string }] : [],
        );
        // the lead and two forks fill a quota of 3
        expect(made.length).toBe(2);
        expect(refused.map((e) => e.code)).toEqual(Array(4).fill('resource_exhausted'));
      }),
    ));
});

/**
 * The same attack on a node that runs as its own process, as nodes do: there an unhandled
 * rejection ends the process, and every project's envs and sandboxes on the node with it.
 */
describe('a fork into an unprobed task env, on a node process', () => {
  const tag = randomBytes(2).toString('hex');
  const taskRoot = join(TEST_DATA_ROOT, `chat-fork-red-node-${tag}`, 'tasks');
  let lone: LoneNode | undefined;
  let envs: Envs;

  beforeAll(async () => {
    for (const name of Object.keys(TASKS)) await writeTask(taskRoot, name);
    lone = await startLoneNode(`f${tag}`, 207, 7960, ['--warm-pool', '0', '--task-root', taskRoot]);
    envs = new WireClient(lone.node.address, ENVS, {
      token: NODE_TOKEN,
      metadata: { [PROJECT_KEY]: 'solo' },
    });
  });

  afterAll(async () => {
    envs?.close();
    if (lone) {
      // what the crashed node left that no env record names (the fork's sandboxes) goes by gc
      await lone.node.stop();
      const left = await Platform.local({ dataDir: lone.node.dataDir, storeDir: STORE_DIR });
      await left.gc();
      await left.close();
      await lone.remove();
    }
    await rm(join(taskRoot, '..'), { recursive: true, force: true });
  });

  /** Whether the node still answers: a Make (closed again) that goes through. */
  async function answers(): Promise<boolean> {
    const made = await envs.call('Make', { spec: BUSYBOX }).catch(() => undefined);
    if (made) await envs.call('Close', { envId: made.envId });
    return made !== undefined;
  }

  /**
   * Forks `from`'s chat checkpoint into a new env of task `into`, never reset; closes both after.
   * Says whether the node lived through it.
   */
  async function forkInto(from: string, into: string): Promise<boolean> {
    const made: string[] = [];
    let lived = true;
    try {
      const lead = (await envs.call('Make', { spec: { kind: 'task', path: from } })).envId;
      made.push(lead);
      await envs.call('ChatReset', { envId: lead });
      const { checkpointId } = await envs.call('Checkpoint', { envId: lead, depth: 'disk' });
      const fork = (await envs.call('Make', { spec: { kind: 'task', path: into }, beside: lead })).envId;
      made.push(fork);
      // whatever it answers: what matters is whether the node lives through it
      await envs.call('ChatRestore', { envId: fork, checkpointId }).catch(() => undefined);
    } finally {
      lived = await answers();
      if (!lived) {
        // a node that died comes back on its data dir, adopting its sandboxes, so they can go
        const child = lone!.node.child;
        if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
        await lone!.node.restart();
      }
      for (const envId of made) await envs.call('Close', { envId }).catch(() => undefined);
    }
    return lived;
  }

  it('honest twin: a fork within one task, its environment probed by the lead, leaves the node up', async () => {
    expect(await forkInto('fork-gift', 'fork-gift')).toBe(true);
  });

  // the probe of a clean sandbox of the task returns its promise from inside `await using`: the
  // sandbox is closed while the probe's commands run, they fail, and the rejection goes unhandled
  // while the close is awaited (most times: a probe that wins the race ends before the close, so
  // the attack goes on to a task the node has not probed yet)
  it('CLOSED: a fork into a task env whose environment the node never probed crashes the node', () =>
    attack('tenant', 'crash a node with a fork into an unprobed task env', async () => {
      let lived = true;
      for (const cold of ['fork-plain', 'fork-cold-1', 'fork-cold-2'])
        if (!(lived = await forkInto('fork-gift', cold))) break;
      expect(lived).toBe(true);
    }));
});
