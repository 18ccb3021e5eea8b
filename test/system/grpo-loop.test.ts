import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/common/index.ts';
import { TaskEnv, loadTasks } from '../../src/env/index.ts';
import { Controller } from '../../src/platform/index.ts';
/** The project's virtual environment's interpreter, as the trainers' adapters are tested with. */
const PYTHON = resolve('.venv/bin/python');
import { NODE_TOKEN, startLoneNode, type LoneNode } from '../support/cluster.ts';
import { createTestPlatform } from '../support/platform.ts';

const TASK_ROOT = resolve('examples/tasks');
const EXAMPLE = resolve('python/examples/grpo_loop.py');
const TENANT = 'grpo-tenant-token-5b8e2d7f1c4a9063';
const GROUP_SIZE = 8;

interface Sample {
  group: number;
  episode_id: string;
  forked_from: string | null;
  reward: number;
  advantage: number;
  outcome: { kind: string };
  turns: { text: string; token_ids: number[]; logprobs: number[]; observations: { role: string }[] }[];
}

/**
 * The runnable GRPO-shaped example (python/examples/grpo_loop.py): groups of 8 forks of one
 * task's chat episode, stepped from Python with Hermes-style tool calls, graded on the node, written out with
 * token ids, logprobs and group-relative advantages; against a node and through a controller.
 */
describe('a GRPO-shaped loop from Python', () => {
  const tag = randomBytes(2).toString('hex');
  let lone: LoneNode | undefined;
  let controller: Controller | undefined;
  let out: string;

  beforeAll(async () => {
    // the task's environment is built once here, in the store the node shares
    await using built = await createTestPlatform('grpo-loop-build');
    const [task] = await loadTasks([join(TASK_ROOT, 'hello-file')]);
    await TaskEnv.create(built.platform, task!).prepare();
    // not a tag starting with g: a node reaps host links named sgg…, its group networks' prefix
    lone = await startLoneNode(`o${tag}`, 246, 7840, ['--warm-pool', '0', '--task-root', TASK_ROOT]);
    controller = await Controller.start({
      listen: '127.0.0.1:0',
      nodes: [lone.node.address],
      nodeToken: NODE_TOKEN,
      grants: { [TENANT]: { project: 'grpo', maxSandboxes: 2 * GROUP_SIZE } },
      logger: silentLogger(),
      pollMs: 200,
    });
    out = await mkdtemp(join(tmpdir(), 'grpo-'));
  });

  afterAll(async () => {
    await controller?.close();
    await lone?.remove();
    await rm(out, { recursive: true, force: true });
  });

  /** Runs the example and reads back what it wrote. */
  async function runLoop(url: string, token: string, dir: string, groups: number): Promise<Sample[]> {
    // not spawnSync: the controller answers from this process, and the node's logs come through
    // pipes this process must keep reading
    const child = spawn(
      PYTHON,
      [
        EXAMPLE,
        '--url',
        url,
        '--token',
        token,
        '--groups',
        String(groups),
        '--group-size',
        String(GROUP_SIZE),
        '--out',
        dir,
      ],
      { env: { ...process.env, PYTHONPATH: resolve('python') }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code, output).toBe(0);
    const text = await readFile(join(dir, 'samples.jsonl'), 'utf8');
    return text
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as Sample);
  }

  function expectGroups(samples: Sample[], groups: number): void {
    expect(samples).toHaveLength(groups * GROUP_SIZE);
    // each group forked its own episode
    expect(new Set(samples.map((s) => s.forked_from)).size).toBe(groups);
    for (let group = 0; group < groups; group++) {
      const mine = samples.filter((s) => s.group === group);
      expect(mine).toHaveLength(GROUP_SIZE);
      for (const sample of mine) {
        expect(sample.outcome).toEqual({ kind: 'ok' });
        expect([0, 1]).toContain(sample.reward);
        const [first] = sample.turns;
        expect(first!.token_ids.length).toBeGreaterThan(0);
        expect(first!.logprobs).toHaveLength(first!.token_ids.length);
        // one message back for the one call it made, or for the call it could not make
        expect(first!.observations).toHaveLength(1);
      }
      // the group's 8 went on from one checkpoint of its episode, each a branch of its own
      const origins = new Set(mine.map((s) => s.forked_from));
      expect(origins.size).toBe(1);
      expect([...origins][0]).toMatch(/^ckpt-/);
      expect(new Set(mine.map((s) => s.episode_id)).size).toBe(GROUP_SIZE);
      // the stand-in policy's seeds give each group right and wrong answers: advantages of both signs
      const rewards = new Set(mine.map((s) => s.reward));
      expect(rewards).toEqual(new Set([0, 1]));
      const advantages = mine.map((s) => s.advantage);
      expect(Math.abs(advantages.reduce((a, b) => a + b, 0))).toBeLessThan(1e-3);
      // a right answer (hello sandgym) scored 1, a wrong or unreadable one 0
      for (const sample of mine) {
        expect(sample.reward === 1).toBe(sample.turns[0]!.text.includes('hello sandgym'));
      }
    }
  }

  it('runs two groups of 8 against a node', async () => {
    expectGroups(await runLoop(`grpc://${lone!.node.address}`, NODE_TOKEN, join(out, 'node'), 2), 2);
  });

  it('runs a group of 8 through a controller, within the tenant quota', async () => {
    expectGroups(
      await runLoop(`grpc://127.0.0.1:${controller!.port}`, TENANT, join(out, 'controller'), 1),
      1,
    );
  });
});
