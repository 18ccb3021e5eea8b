import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/common/index.ts';
import { NodeAgent, Platform } from '../../src/platform/index.ts';
import { TrainingCoordinator } from '../../src/rollout/index.ts';
import { createTestPlatform } from '../support/platform.ts';

const TOKEN = 'node-secret-trainer-signals-8c1e';
const DOOR = resolve('dist/src/index.js');

/**
 * A trainer as its own process: it connects to the node, starts (or rejoins) its run, maps
 * preemption signals to phases, makes a sandbox with a counting process in it, and prints each
 * phase it published as a JSON line.
 */
const TRAINER = `
const { Platform, TrainingCoordinator } = await import(process.env.DOOR);
const platform = await Platform.connect(process.env.URL, { token: process.env.TOKEN });
const coordinator = await TrainingCoordinator.start(platform, { name: 'signals', leaseMs: 600, ttlMs: 120000 });
coordinator.phases$.subscribe((e) => console.log(JSON.stringify({ phase: e.phase, report: e.report })));
coordinator.handleSignals();
const sandbox = await platform.createSandbox({ environment: 'busybox:latest', resources: { memoryMib: 64 }, run: 'signals' });
await sandbox.writeFile('/root/work', 'kept');
const loop = await sandbox.exec(['sh', '-c', 'sh -c "while true; do sleep 0.2; done" >/dev/null 2>&1 & echo $!']);
console.log(JSON.stringify({ sandbox: sandbox.id, loop: loop.stdout.trim() }));
setInterval(() => {}, 60000);
`;

/** Reads a child's stdout as JSON lines. */
function linesOf(child: ChildProcess): AsyncIterator<string> {
  return createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
}

async function nextJson(lines: AsyncIterator<string>): Promise<Record<string, unknown>> {
  const line: IteratorResult<string> = await lines.next();
  if (line.done) throw new Error('the trainer ended before it printed');
  return JSON.parse(line.value) as Record<string, unknown>;
}

describe('a trainer process and its signals', () => {
  it('hibernates its run on SIGUSR1 and SIGTERM, dies as told, and a restart resumes the run by name', async () => {
    if (!existsSync(DOOR)) throw new Error(`${DOOR} is missing: run "npm run build" (npm test does)`);
    await using test = await createTestPlatform('trainer-signals');
    const node = await NodeAgent.start(test.platform, {
      listen: '127.0.0.1:0',
      token: TOKEN,
      logger: silentLogger(),
    });
    const url = `grpc://127.0.0.1:${node.port}`;
    const client = await Platform.connect(url, { token: TOKEN });
    const trainer = spawn(process.execPath, ['--input-type=module', '-e', TRAINER], {
      env: { ...process.env, DOOR, URL: url, TOKEN },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      const lines = linesOf(trainer);
      const { sandbox: id, loop } = (await nextJson(lines)) as { sandbox: string; loop: string };
      // a notice of preemption: the trainer lives on, its sandboxes hibernate
      trainer.kill('SIGUSR1');
      expect(await nextJson(lines)).toMatchObject({ phase: 'preempted', report: { hibernated: [id] } });
      const sandbox = await client.attachSandbox(id);
      expect((await sandbox.stats()).state).toBe('hibernated');
      expect(trainer.exitCode).toBeNull();
      // back to work, then the scheduler ends the trainer
      expect((await sandbox.exec(['cat', '/root/work'])).stdout).toBe('kept');
      trainer.kill('SIGTERM');
      expect(await nextJson(lines)).toMatchObject({ phase: 'preempted', report: { hibernated: [id] } });
      const [code, signal] = (await once(trainer, 'exit')) as [number | null, string | null];
      expect({ code, signal }).toEqual({ code: null, signal: 'SIGTERM' });
      // its lease lapses; the run and its hibernated sandbox stay for the grace
      await new Promise((done) => setTimeout(done, 1_500));
      expect((await sandbox.stats()).state).toBe('hibernated');
      // the restarted trainer rejoins by name and resumes: the same processes and files
      const restarted = await TrainingCoordinator.start(client, { name: 'signals', leaseMs: 60_000 });
      try {
        expect((await restarted.phase('resumed')).resumed).toEqual([id]);
        expect((await sandbox.exec(['kill', '-0', loop])).exitCode).toBe(0);
        expect((await sandbox.exec(['cat', '/root/work'])).stdout).toBe('kept');
      } finally {
        expect((await restarted.run.end()).destroyed).toEqual([id]);
        await restarted.end().catch(() => undefined);
      }
    } finally {
      if (trainer.exitCode === null && trainer.signalCode === null) trainer.kill('SIGKILL');
      await client.close();
      await node.close();
    }
  });
});
