import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { readFile, readdir, rm, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { ContainerSandbox } from '../../src/backends/container/container-sandbox.ts';
import { MAX_CHECKPOINTS_PER_SANDBOX } from '../../src/backends/contract.ts';
import { hostCanGrantSysResource } from '../../src/backends/host/capabilities.ts';
import { detectCriu } from '../../src/backends/host/criu.ts';
import { ensureSwapFile, removeSwapFile } from '../../src/backends/index.ts';
import { activeSwapAreas } from '../../src/backends/host/swap.ts';
import { silentLogger } from '../../src/common/index.ts';
import { SandboxEnv } from '../../src/env/index.ts';
import { NodeAgent, Platform, type PlatformClient } from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import { STORE_DIR, TEST_DATA_ROOT, createTestPlatform, type TestPlatform } from '../support/platform.ts';

// `npm test` builds CRIU 4.1 (`sandgym setup --criu`); without it, containers hibernate by reclaim
const criu = await detectCriu();
if (!criu.usable) console.warn(`container memory snapshots are not tested: ${criu.reason}`);

/** The folders under `root` whose names match `name`, however deep. */
async function findDirs(root: string, name: RegExp): Promise<string[]> {
  const entries = await readdir(root, { recursive: true, withFileTypes: true });
  return entries.filter((e) => e.isDirectory() && name.test(e.name)).map((e) => join(e.parentPath, e.name));
}

/** Starts a process that holds ~48 MB of anonymous memory and counts in /tmp/count; its pid. */
const HOLDER = [
  'sh',
  '-c',
  'sh -c \'x=$(head -c 48000000 /dev/zero | tr "\\0" a); i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done\' >/dev/null 2>&1 & echo $!',
];

/** A run on the test platform, and one container of `environment` in it. */
async function sandboxInRun(test: TestPlatform, name: string, environment: string) {
  const run = await test.platform.startRun({ name: `${name}-${process.pid}`, leaseMs: 600_000 });
  const sandbox = await test.platform.createSandbox({
    environment,
    resources: { memoryMib: 256 },
    run: run.name,
  });
  return { run, sandbox };
}

describe.skipIf(!criu.usable)('container memory snapshots (CRIU)', () => {
  it('hibernate an idle container to disk: ≥ 90% of its memory freed, its processes back on the next request', async () => {
    await using test = await createTestPlatform('container-memory');
    const sandbox = await test.platform.createSandbox({
      environment: 'busybox:latest',
      resources: { memoryMib: 256 },
    });
    try {
      const holder = (await sandbox.exec(HOLDER)).stdout.trim();
      await sandbox.writeFile('/root/note', 'written before');
      // the holder has filled its memory once it counts
      for (let i = 0; (await sandbox.exec(['cat', '/tmp/count'])).exitCode !== 0; i++) {
        if (i > 100) throw new Error('the holder never started counting');
        await new Promise((done) => setTimeout(done, 100));
      }
      const before = await sandbox.stats();
      expect(before.memoryBytes).toBeGreaterThan(48e6);
      const report = await sandbox.hibernate();
      const after = await sandbox.stats();
      expect(after.state).toBe('hibernated');
      expect(after.pids).toBe(0);
      // kernel memory too: the processes are gone, not swapped
      expect(report.freedBytes).toBeGreaterThanOrEqual(before.memoryBytes * 0.9);
      expect(after.memoryBytes).toBeLessThanOrEqual(before.memoryBytes * 0.1);
      expect(report.imageBytes).toBeGreaterThan(40e6);
      // the image holds its whole memory: root's alone on the node, and nowhere in the sandbox
      const images = await findDirs(test.dataDir, /^memory-/);
      expect(images).toHaveLength(1);
      const image = await stat(images[0]!);
      expect([image.uid, image.mode & 0o777]).toEqual([0, 0o700]);
      // any request brings it back: the same process, still counting, its files kept
      expect((await sandbox.exec(['kill', '-0', holder])).exitCode).toBe(0);
      expect((await sandbox.readFile('/root/note')).toString()).toBe('written before');
      const count = async (): Promise<number> => Number((await sandbox.exec(['cat', '/tmp/count'])).stdout);
      const first = await count();
      await new Promise((done) => setTimeout(done, 1_000));
      expect(await count()).toBeGreaterThan(first);
      expect((await sandbox.stats()).memoryBytes).toBeGreaterThan(48e6);
      // and it hibernates again
      expect((await sandbox.hibernate()).freedBytes).toBeGreaterThan(48e6);
      expect((await sandbox.exec(['echo', 'again'])).stdout).toBe('again\n');
    } finally {
      await sandbox.close();
    }
  });

  it('keep its own network namespace while hibernated, and let it go with the sandbox', async () => {
    await using test = await createTestPlatform('container-memory-netns');
    const sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    const keptUnder = (): string[] =>
      readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .filter((line) => line.includes(' - nsfs ') && line.includes(test.dataDir));
    let closed = false;
    try {
      const namespace = async (): Promise<string> =>
        (await sandbox.exec(['readlink', '/proc/self/ns/net'])).stdout;
      const before = await namespace();
      expect(await sandbox.hibernate()).toMatchObject({ state: 'hibernated' });
      expect(keptUnder()).toHaveLength(1);
      // the same namespace, not a copy CRIU rebuilt
      expect(await namespace()).toBe(before);
      expect(keptUnder()).toHaveLength(0);
      // a fork never shares it: a copy's processes get a network of their own
      {
        await using group = await test.platform.fork(sandbox, 1, { depth: 'memory' });
        const copy = await group.sandboxes[0]!.exec(['readlink', '/proc/self/ns/net']);
        expect(copy.stdout, JSON.stringify(copy)).toMatch(/^net:\[\d+\]/);
        expect(copy.stdout).not.toBe(before);
      }
      // a dump CRIU refuses (on some kernels, any open internet socket) keeps nothing mounted
      const listener = (
        await sandbox.exec(['sh', '-c', 'nc -ll -p 7070 -e true >/dev/null 2>&1 & echo $!'])
      ).stdout.trim();
      const refused = await sandbox.hibernate();
      expect(keptUnder()).toHaveLength(refused.imageBytes === undefined ? 0 : 1);
      expect((await sandbox.exec(['kill', '-9', listener])).exitCode).toBe(0);
      // hibernated again and destroyed so: nothing stays mounted
      const again = await sandbox.hibernate();
      expect(keptUnder(), JSON.stringify(again)).toHaveLength(1);
      await sandbox.close();
      closed = true;
      expect(keptUnder()).toHaveLength(0);
    } finally {
      if (!closed) await sandbox.close();
    }
  });

  it('freeze a container with a request in flight instead, which then completes', async () => {
    await using test = await createTestPlatform('container-memory-busy');
    const sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      const step = sandbox.exec(['sh', '-c', 'sleep 1; echo done']);
      await new Promise((done) => setTimeout(done, 200));
      const report = await sandbox.hibernate();
      expect(report.imageBytes).toBeUndefined();
      // frozen; hibernated only where swap took its memory
      const swap = (await activeSwapAreas()).length > 0;
      expect(report.state).toBe(swap ? 'hibernated' : 'paused');
      if (!swap) expect(report.reason).toMatch(/a request was in flight.*no swap/);
      expect((await sandbox.stats()).state).toBe(report.state);
      await sandbox.resume();
      expect((await step).stdout).toBe('done\n');
    } finally {
      await sandbox.close();
    }
  });

  it('report a hibernation that could not free memory as what it was: a pause, and why', async () => {
    await using test = await createTestPlatform('container-memory-kept');
    const { run, sandbox } = await sandboxInRun(test, 'kept', 'debian:bookworm');
    try {
      // a child held ptrace-stopped by its parent, which holds ~48 MB: CRIU cannot dump the tree
      await sandbox.writeFile(
        '/root/traced.py',
        [
          'import ctypes, os, signal, time',
          'if os.fork() == 0:',
          '    ctypes.CDLL(None).ptrace(0, 0, 0, 0)',
          '    os.kill(os.getpid(), signal.SIGSTOP)',
          '    os._exit(0)',
          'held = bytearray(48_000_000)',
          'for i in range(0, len(held), 4096): held[i] = 1',
          "open('/tmp/holding', 'w').close()",
          'time.sleep(3600)',
        ].join('\n'),
      );
      await sandbox.exec(['sh', '-c', 'python3 /root/traced.py >/dev/null 2>&1 &']);
      for (let i = 0; (await sandbox.exec(['test', '-e', '/tmp/holding'])).exitCode !== 0; i++) {
        if (i > 200) throw new Error('the holder never held its memory');
        await new Promise((done) => setTimeout(done, 50));
      }
      const before = await sandbox.stats();
      const report = await sandbox.hibernate();
      if ((await activeSwapAreas()).length > 0) {
        // swap takes the memory CRIU could not: a hibernation after all
        expect(report).toMatchObject({ state: 'hibernated' });
        expect(report.swappedBytes).toBeGreaterThan(0);
        return;
      }
      expect(report.state).toBe('paused');
      expect(report.reason).toMatch(/CRIU could not checkpoint.*no swap/);
      expect(report.imageBytes).toBeUndefined();
      // what it said is what the cgroup shows: the memory stayed
      expect(report.residentBytes).toBeGreaterThan(48e6);
      expect(report.freedBytes).toBeLessThan(before.memoryBytes / 2);
      const after = await sandbox.stats();
      expect(after.state).toBe('paused');
      expect(after.memoryBytes).toBeGreaterThan(48e6);
      // a preemption says the same of it
      await sandbox.resume();
      const preempted = await run.phase('preempted');
      expect(preempted.hibernated).toEqual([]);
      expect(preempted.paused).toEqual([sandbox.id]);
      expect(preempted.keptMemory).toEqual([
        { sandboxId: sandbox.id, reason: expect.stringMatching(/CRIU/) as unknown },
      ]);
      // and it carries on when asked
      expect((await sandbox.exec(['echo', 'back'])).stdout).toBe('back\n');
    } finally {
      await sandbox.close();
      await run.end();
    }
  });

  it('sync the trajectory log before hibernating to an image, the state that outlives the host', async () => {
    await using test = await createTestPlatform('container-memory-log');
    await using env = SandboxEnv.create(test.platform, { sandbox: { environment: 'busybox:latest' } });
    await env.reset();
    await env.step({ type: 'exec', command: 'echo one >> /root/steps' });
    const sandbox = env.current!;
    const log = await test.platform.trajectory(sandbox.id);
    // a step writes its record and answers: the disk waits for a barrier
    expect(log.durableBytes).toBeLessThan(log.room.usedBytes);
    const report = await sandbox.hibernate();
    expect(report.imageBytes).toBeGreaterThan(0);
    expect(log.durableBytes).toBe(log.room.usedBytes);
    // the steps after it are the resumed sandbox's, written and not synced until the next image
    await env.step({ type: 'exec', command: 'echo two >> /root/steps' });
    expect(log.durableBytes).toBeLessThan(log.room.usedBytes);
    expect((await sandbox.readFile('/root/steps')).toString()).toBe('one\ntwo\n');
  });

  it('make no image of a sandbox whose log cannot sync: it hibernates by reclaim, a host crash ends it', async () => {
    await using test = await createTestPlatform('container-memory-log-fails');
    await using env = SandboxEnv.create(test.platform, { sandbox: { environment: 'busybox:latest' } });
    await env.reset();
    await env.step({ type: 'exec', command: 'echo one >> /root/steps' });
    const sandbox = env.current!;
    // its descriptor gone under it: the barrier's sync fails as a failing disk's would
    await (await test.platform.trajectory(sandbox.id)).close();
    const report = await sandbox.hibernate();
    expect(report.imageBytes).toBeUndefined();
    if (report.state === 'paused') expect(report.reason).toMatch(/Cannot sync the trajectory log/);
    await sandbox.resume();
    expect((await sandbox.readFile('/root/steps')).toString()).toBe('one\n');
  });

  it('restore a run at rollout all at once; a preemption right after finds them back and hibernates them again', async () => {
    await using test = await createTestPlatform('container-memory-rollout');
    const run = await test.platform.startRun({ name: `rollout-${process.pid}`, leaseMs: 600_000 });
    const sandboxes = await Promise.all(
      [0, 1, 2].map(() =>
        test.platform.createSandbox({
          environment: 'busybox:latest',
          resources: { memoryMib: 256 },
          run: run.name,
        }),
      ),
    );
    try {
      const holders = await Promise.all(sandboxes.map(async (s) => (await s.exec(HOLDER)).stdout.trim()));
      for (const sandbox of sandboxes) {
        for (let i = 0; (await sandbox.exec(['cat', '/tmp/count'])).exitCode !== 0; i++) {
          if (i > 100) throw new Error('the holder never started counting');
          await new Promise((done) => setTimeout(done, 100));
        }
      }
      const ids = sandboxes.map((s) => s.id).sort();
      const first = await run.phase('preempted');
      expect(first.hibernated.sort()).toEqual(ids);
      const rollout = await run.phase('rollout');
      expect(rollout.resumed.sort()).toEqual(ids);
      for (const id of rollout.restoring) expect(ids).toContain(id);
      // no request came, and yet a preemption now applies to running sandboxes, not half-restored ones
      const again = await run.phase('preempted');
      expect(again.hibernated.sort()).toEqual(ids);
      for (const sandbox of sandboxes) {
        const stats = await sandbox.stats();
        expect(stats.state).toBe('hibernated');
        expect(stats.memoryBytes).toBeLessThan(10e6);
      }
      expect(again.freedBytes).toBeGreaterThan(3 * 40e6);
      // and a request after the next rollout finds its own processes
      await run.phase('rollout');
      const alive = await Promise.all(sandboxes.map((s, i) => s.exec(['kill', '-0', holders[i]!])));
      expect(alive.map((r) => r.exitCode)).toEqual([0, 0, 0]);
    } finally {
      await Promise.all(sandboxes.map((s) => s.close()));
      await run.end();
    }
  });

  it('keep the processes of a preemption the trainer expects to be short, onto swap, even after a restore', async () => {
    await using test = await createTestPlatform('container-memory-short');
    const swapFile = `${test.dataDir}.swapfile`;
    await ensureSwapFile(swapFile, 128);
    const { run, sandbox } = await sandboxInRun(test, 'short', 'busybox:latest');
    try {
      const holder = (await sandbox.exec(HOLDER)).stdout.trim();
      await expectCode(run.phase('preempted', { expectedMs: 0 }), 'invalid_argument', /expectedMs/);
      // a long one dumps it: its agent comes back on a new channel
      const long = await run.phase('preempted', { expectedMs: 3_600_000 });
      expect(long.hibernated).toEqual([sandbox.id]);
      expect((await sandbox.stats()).memoryBytes).toBeLessThan(10e6);
      await run.phase('rollout');
      expect((await sandbox.exec(['kill', '-0', holder])).exitCode).toBe(0);
      // a short one freezes it and pushes its memory to swap: its processes stay
      const short = await run.phase('preempted', { expectedMs: 5_000 });
      expect(short.hibernated).toEqual([sandbox.id]);
      expect((await sandbox.stats()).pids).toBeGreaterThan(0);
      // the thaw checks the agent it has now, not the one it was created with
      await run.phase('rollout');
      expect((await sandbox.exec(['kill', '-0', holder])).exitCode).toBe(0);
    } finally {
      await sandbox.close();
      await run.end();
      await removeSwapFile(swapFile);
    }
  });

  it('outlive their owner hibernated: a successor adopts the sandbox and its first request restores it', async () => {
    const dataDir = join(TEST_DATA_ROOT, `container-memory-adopt-${process.pid}`);
    // the first owner hibernates a durable sandbox and dies without closing anything
    const first = spawnSync(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `
const { Platform } = await import(${JSON.stringify(resolve('dist/src/index.js'))});
const platform = await Platform.local({ dataDir: process.env.DATA, storeDir: process.env.STORE, durable: true });
const sandbox = await platform.createSandbox({ environment: 'busybox:latest' });
const holder = await sandbox.exec(${JSON.stringify(HOLDER)});
await sandbox.writeFile('/root/note', 'before the owner died');
await sandbox.hibernate();
console.log(JSON.stringify({ id: sandbox.id, holder: holder.stdout.trim() }));
process.exit(0);
`,
      ],
      { env: { ...process.env, DATA: dataDir, STORE: STORE_DIR }, encoding: 'utf8', timeout: 120_000 },
    );
    expect(first.status, first.stderr).toBe(0);
    const { id, holder } = JSON.parse(first.stdout) as { id: string; holder: string };
    const successor = await Platform.local({ dataDir, storeDir: STORE_DIR, durable: true });
    try {
      const adopted = await successor.adoptSandboxes();
      expect(adopted.map((s) => [s.id, s.state])).toEqual([[id, 'hibernated']]);
      const sandbox = adopted[0]!;
      expect((await sandbox.exec(['kill', '-0', holder])).exitCode).toBe(0);
      expect((await sandbox.readFile('/root/note')).toString()).toBe('before the owner died');
      await sandbox.close();
    } finally {
      await successor.close();
      await rm(dataDir, { recursive: true, force: true });
    }
  });

  it('checkpoint, restore in place and fork, embedded and over the wire, and SandboxEnv says memory', async () => {
    await using test = await createTestPlatform('container-checkpoint');
    const node = await NodeAgent.start(test.platform, {
      listen: '127.0.0.1:0',
      token: 'node-secret-container-checkpoint',
      logger: silentLogger(),
    });
    const remote = await Platform.connect(`grpc://127.0.0.1:${node.port}`, {
      token: 'node-secret-container-checkpoint',
    });
    try {
      for (const platform of [test.platform, remote] as PlatformClient[]) {
        const sandbox = await platform.createSandbox({
          environment: 'busybox:latest',
          resources: { pids: 24 },
        });
        try {
          const holder = (await sandbox.exec(HOLDER)).stdout.trim();
          await sandbox.writeFile('/root/state', 'one');
          // a tree deeper than any path the host could name: restores and forks never walk it
          await sandbox.exec([
            'sh',
            '-c',
            `cd /root && for i in $(seq 40); do mkdir ${'d'.repeat(200)} && cd ${'d'.repeat(200)}; done`,
          ]);
          const checkpoint = await sandbox.checkpoint();
          expect(checkpoint).toMatchObject({ sandboxId: sandbox.id, depth: 'memory' });
          // it carries on after the checkpoint
          await sandbox.writeFile('/root/state', 'two');
          await sandbox.writeFile('/root/later', 'made after');
          await sandbox.exec(['kill', '-9', holder]);
          await sandbox.restore(checkpoint);
          expect((await sandbox.readFile('/root/state')).toString()).toBe('one');
          expect((await sandbox.exec(['test', '-e', '/root/later'])).exitCode).toBe(1);
          expect((await sandbox.exec(['kill', '-0', holder])).exitCode).toBe(0);
          // a checkpoint can be gone back to again
          await sandbox.writeFile('/root/state', 'three');
          await sandbox.restore(checkpoint.id);
          expect((await sandbox.readFile('/root/state')).toString()).toBe('one');
          // a fork for a GRPO group: each copy carries on the same processes, then goes its own way
          await using group = await platform.fork(sandbox, 2, { depth: 'memory' });
          for (const [i, copy] of group.sandboxes.entries()) {
            expect(copy.id).not.toBe(sandbox.id);
            expect((await copy.exec(['kill', '-0', holder])).exitCode).toBe(0);
            expect((await copy.readFile('/root/state')).toString()).toBe('one');
            await copy.writeFile('/root/state', `copy ${i}`);
            // its own cgroups, with the source's limits
            await copy.exec(['sh', '-c', 'for i in $(seq 40); do sleep 2 & done; wait'], {
              timeoutMs: 20_000,
            });
            expect((await copy.stats()).pidsLimitHits).toBeGreaterThan(0);
          }
          expect((await group.sandboxes[1]!.readFile('/root/state')).toString()).toBe('copy 1');
          expect((await sandbox.readFile('/root/state')).toString()).toBe('one');
          const listed = (await platform.listSandboxes()).map((r) => r.id);
          expect(listed).toEqual(expect.arrayContaining(group.sandboxes.map((s) => s.id)));
          // a restore as new: a branch from the earlier checkpoint, the source left as it is
          await sandbox.writeFile('/root/state', 'four');
          await using branch = await platform.fork(sandbox, 1, { depth: 'memory', checkpoint });
          expect((await branch.sandboxes[0]!.readFile('/root/state')).toString()).toBe('one');
          expect((await sandbox.readFile('/root/state')).toString()).toBe('four');
        } finally {
          await sandbox.close();
        }
      }
      await using env = SandboxEnv.create(test.platform, { sandbox: { environment: 'busybox:latest' } });
      await env.reset();
      await env.step({ type: 'write_file', path: '/root/step', content: 'before' });
      const ref = await env.checkpoint();
      expect(ref.depth).toBe('memory');
      await env.step({ type: 'write_file', path: '/root/step', content: 'after' });
      await env.restore(ref);
      const read = await env.step({ type: 'read_file', path: '/root/step' });
      expect(read.observation).toMatchObject({ content: 'before' });
    } finally {
      await remote.close();
      await node.close();
    }
  });

  it('give every fork its own value to reseed from; processes started after the fork draw anew', async () => {
    await using test = await createTestPlatform('container-fork-reseed');
    const sandbox = await test.platform.createSandbox({ environment: 'debian:bookworm' });
    try {
      // a long-running process that seeded its generator before the fork, and draws once told to
      await sandbox.writeFile(
        '/root/drawer.py',
        [
          'import os, random, time',
          'random.seed(os.urandom(16))',
          "open('/tmp/seeded', 'w').close()",
          "while not os.path.exists('/tmp/go'): time.sleep(0.05)",
          "fork = open('/run/sandgym/fork').read() if os.path.exists('/run/sandgym/fork') else ''",
          "open('/tmp/drawn.tmp', 'w').write(f'{random.random()} {fork}')",
          "os.rename('/tmp/drawn.tmp', '/tmp/drawn')",
          'time.sleep(3600)',
        ].join('\n'),
      );
      await sandbox.exec(['sh', '-c', 'python3 /root/drawer.py >/dev/null 2>&1 &']);
      for (let i = 0; (await sandbox.exec(['test', '-e', '/tmp/seeded'])).exitCode !== 0; i++) {
        if (i > 200) throw new Error('the running process never seeded');
        await new Promise((done) => setTimeout(done, 50));
      }
      const group = await test.platform.fork(sandbox, 3, { depth: 'memory' });
      try {
        const seen: Record<
          'runningDraw' | 'runningSawFork' | 'fork' | 'laterDraw' | 'laterEnv',
          string | undefined
        >[] = [];
        for (const copy of group.sandboxes) {
          await copy.writeFile('/tmp/go', '');
          let drawn = await copy.exec(['cat', '/tmp/drawn']);
          for (let i = 0; drawn.exitCode !== 0; i++) {
            if (i > 200) throw new Error(`the running process of ${copy.id} never drew`);
            await new Promise((done) => setTimeout(done, 50));
            drawn = await copy.exec(['cat', '/tmp/drawn']);
          }
          const [runningDraw, runningSawFork] = drawn.stdout.split(' ');
          const fork = (await copy.readFile('/run/sandgym/fork')).toString();
          const later = await copy.exec([
            'python3',
            '-c',
            'import os, random; print(random.random(), os.environ.get("SANDGYM_FORK", ""))',
          ]);
          const [laterDraw, laterEnv] = later.stdout.trim().split(' ');
          seen.push({ runningDraw, runningSawFork, fork, laterDraw, laterEnv });
        }
        const distinct = (key: keyof (typeof seen)[number]): number => new Set(seen.map((s) => s[key])).size;
        // the memory of a running process is the source's in every copy: it draws the same numbers
        expect(distinct('runningDraw')).toBe(1);
        // but each copy has its own value to reseed from, which the running process can read
        expect(distinct('fork')).toBe(3);
        for (const s of seen) {
          expect(s.fork).toMatch(/^[0-9a-f]{32}$/);
          expect(s.runningSawFork).toBe(s.fork);
          expect(s.laterEnv).toBe(s.fork);
        }
        // and a process started after the fork draws differently in each
        expect(distinct('laterDraw')).toBe(3);
        // a restore in place is a new copy too
        const checkpoint = await group.sandboxes[0]!.checkpoint();
        const before = seen[0]!.fork;
        await group.sandboxes[0]!.restore(checkpoint);
        expect((await group.sandboxes[0]!.readFile('/run/sandgym/fork')).toString()).not.toBe(before);
        // a disk fork's copies get their own values too, never the one the source's files hold
        const disk = await test.platform.fork(group.sandboxes[1]!, 2);
        try {
          const values = await Promise.all(
            disk.sandboxes.map(async (copy) => (await copy.readFile('/run/sandgym/fork')).toString()),
          );
          expect(new Set([...values, seen[1]!.fork]).size).toBe(3);
          const env = await disk.sandboxes[0]!.exec(['sh', '-c', 'echo $SANDGYM_FORK']);
          expect(env.stdout).toBe(`${values[0]}\n`);
        } finally {
          await disk.close();
        }
      } finally {
        await group.close();
      }
    } finally {
      await sandbox.close();
    }
  });

  it('keep at most MAX_CHECKPOINTS_PER_SANDBOX checkpoints: a newer one deletes the oldest', async () => {
    await using test = await createTestPlatform('container-checkpoint-cap');
    const sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      const made = [];
      for (let i = 0; i <= MAX_CHECKPOINTS_PER_SANDBOX; i++) made.push(await sandbox.checkpoint());
      const dir = join(test.dataDir, 'sandboxes', sandbox.id);
      const kept = (await readdir(dir)).filter((name) => name.startsWith('memory-ckpt-'));
      expect(kept).toHaveLength(MAX_CHECKPOINTS_PER_SANDBOX);
      await expectCode(sandbox.restore(made[0]!), 'not_found', /lives as long as/);
      await sandbox.restore(made[1]!);
      expect((await sandbox.exec(['echo', 'back'])).stdout).toBe('back\n');
    } finally {
      await sandbox.close();
    }
  });

  // CRIU reads every process's rlimits, which the kernel allows for another user's process only
  // with CAP_SYS_RESOURCE: where the host withholds it, a process left running as uid 1000 once
  // made the checkpoint a platform_error that named neither cause nor fix
  it('checkpoint a container with a non-root process, or say which capability it lacks', async () => {
    await using test = await createTestPlatform('container-checkpoint-user');
    const sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      const started = await sandbox.exec(['sh', '-c', 'sleep 1000 >/dev/null 2>&1 </dev/null & echo $!'], {
        user: '1000:1000',
      });
      const pid = started.stdout.trim();
      expect(pid).toMatch(/^\d+$/);
      const made = sandbox.checkpoint();
      if (await hostCanGrantSysResource()) await expect(made).resolves.toMatchObject({ depth: 'memory' });
      else await expectCode(made, 'unsupported', /run as a user other than root.*CAP_SYS_RESOURCE/);
      // its twin: once only root's processes are left, the checkpoint is made
      const gone = await sandbox.exec([
        'sh',
        '-c',
        `kill -9 ${pid}; while [ -e /proc/${pid} ]; do sleep 0.1; done; ps -o user,pid,args`,
      ]);
      expect(gone.exitCode, gone.stdout + gone.stderr).toBe(0);
      expect(await sandbox.checkpoint()).toMatchObject({ depth: 'memory' });
    } finally {
      await sandbox.close();
    }
  });

  it("fork with the source's whole spec: a best-effort source makes best-effort copies", async () => {
    await using test = await createTestPlatform('container-fork-qos');
    const source = (await test.platform.createSandbox({
      environment: 'busybox:latest',
      qos: 'best_effort',
    })) as ContainerSandbox;
    try {
      await using group = await test.platform.fork(source, 1, { depth: 'memory' });
      const copy = group.sandboxes[0] as ContainerSandbox;
      const shares = await cpuWeightOf(source);
      expect(shares).toBeDefined();
      expect(await cpuWeightOf(copy)).toBe(shares);
      expect(copy.resources).toEqual(source.resources);
    } finally {
      await source.close();
    }
  });
});

/** The CPU weight its cgroup gives it (v1 cpu.shares, v2 cpu.weight): what its QoS class sets. */
async function cpuWeightOf(sandbox: ContainerSandbox): Promise<string | undefined> {
  for (const dir of sandbox.cgroup.allPaths()) {
    for (const file of ['cpu.shares', 'cpu.weight']) {
      const text = await readFile(join(dir, file), 'utf8').catch(() => undefined);
      if (text !== undefined) return text.trim();
    }
  }
  return undefined;
}
