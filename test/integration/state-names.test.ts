import { describe, expect, it } from 'vitest';
import { detectCriu } from '../../src/backends/host/criu.ts';
import { ensureSwapFile, removeSwapFile } from '../../src/backends/index.ts';
import type { PhaseReport } from '../../src/platform/index.ts';
import { createTestPlatform } from '../support/platform.ts';

const criu = await detectCriu();
if (!criu.usable) console.warn(`hibernation by memory image is not tested here: ${criu.reason}`);

/** Starts a process that holds ~48 MB of anonymous memory, so reclaim has something to swap. */
const HOLDER = [
  'sh',
  '-c',
  'sh -c \'x=$(head -c 48000000 /dev/zero | tr "\\0" a); sleep 3600\' >/dev/null 2>&1 &',
];

/** What a phase report calls a sandbox: the list it is in. */
function reportedState(report: PhaseReport, id: string): string {
  if (report.hibernated.includes(id)) return 'hibernated';
  if (report.paused.includes(id)) return 'paused';
  return 'running';
}

/**
 * One name per state: what a phase report calls a sandbox is what `sandgym ps` (listSandboxes,
 * which reads the node's records as any process would) calls it. `paused` keeps its memory in
 * the node's; `hibernated` has written it out, to a memory image or to swap.
 */
describe.skipIf(!criu.usable)('sandbox states', () => {
  it('are named alike by phase reports and by ps: paused, hibernated by image, hibernated to swap', async () => {
    await using test = await createTestPlatform('state-names');
    const swapFile = `${test.dataDir}.swapfile`;
    await ensureSwapFile(swapFile, 128);
    const run = await test.platform.startRun({ name: `state-names-${process.pid}`, leaseMs: 600_000 });
    const sandbox = await test.platform.createSandbox({
      environment: 'busybox:latest',
      resources: { memoryMib: 256 },
      run: run.name,
    });
    const listed = async (): Promise<string | undefined> =>
      (await test.platform.listSandboxes()).find((r) => r.id === sandbox.id)?.state;
    try {
      await sandbox.exec(HOLDER);
      const train = await run.phase('train');
      expect(reportedState(train, sandbox.id)).toBe('paused');
      expect(await listed()).toBe('paused');
      await run.phase('rollout');
      expect(await listed()).toBe('running');

      // a long preemption dumps its processes to a memory image
      const long = await run.phase('preempted', { expectedMs: 3_600_000 });
      expect(reportedState(long, sandbox.id)).toBe('hibernated');
      expect(await listed()).toBe('hibernated');
      await run.phase('rollout');
      await sandbox.exec(['true']);
      expect(await listed()).toBe('running');

      // a short one freezes it and pushes its memory to swap: hibernated, or paused where swap
      // took none of it (the report says why); ps says the same either way
      const short = await run.phase('preempted', { expectedMs: 5_000 });
      expect(short.keptMemory.length > 0 ? 'paused' : 'hibernated').toBe(reportedState(short, sandbox.id));
      expect(await listed()).toBe(reportedState(short, sandbox.id));
      await run.phase('rollout');
      expect(await listed()).toBe('running');
    } finally {
      await sandbox.close();
      await run.end();
      await removeSwapFile(swapFile);
    }
  });
});
