// Red team of hibernation that keeps the sandbox's network namespace (kept-network.ts) and of
// CRIU's kernel cache tmpfs (criu.ts), driven through the real platform. An attack that works is
// an `it.fails` OPEN BREAK asserting the safe outcome; each has an honest twin that passes.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import {
  INSTALLED_CRIU,
  SANDGYM_CRIU_RUN_DIR,
  criuProgram,
  detectCriu,
} from '../../src/backends/host/criu.ts';
import { Platform } from '../../src/platform/index.ts';
import { STORE_DIR, TEST_DATA_ROOT, createTestPlatform } from '../support/platform.ts';

const criu = await detectCriu();

/** The nsfs mounts under `dir`: network namespaces a hibernation keeps. */
function keptUnder(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((line) => line.includes(' - nsfs ') && line.includes(dir));
}

/**
 * The mounts below `dir` (not `dir` itself), which it then unmounts, whole trees, and removes
 * with the folders of `dir`: what a break left on the host is not left for the next test.
 */
function removeMountsUnder(dir: string): string[] {
  const points = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .filter((point) => point.startsWith(`${dir}/`));
  const tops = points.filter((point) => !points.some((other) => point.startsWith(`${other}/`)));
  for (const point of tops) execFileSync('umount', ['-R', point], { stdio: 'ignore' });
  if (points.length) execFileSync('sh', ['-c', 'rm -rf "$1"/*', 'sh', dir]);
  return points;
}

/**
 * A static program that vforks a child which never execs nor exits: the parent waits in the
 * kernel (state D) where no ptrace stop reaches it, so CRIU cannot seize it and gives up after
 * its own seize timeout. Built on the host, copied into the sandbox: what any tenant can run.
 */
function unseizableProgram(): Buffer {
  return readFileSync(unseizableProgramPath());
}

function unseizableProgramPath(): string {
  const dir = mkdtempSync(join(tmpdir(), 'sandgym-red-hib-'));
  writeFileSync(
    join(dir, 'vf.c'),
    '#include <unistd.h>\n#include <sys/syscall.h>\nint main(void) { if (vfork() == 0) for (;;) syscall(SYS_pause); return 0; }\n',
  );
  execFileSync('gcc', ['-static', '-O2', '-o', join(dir, 'vf'), join(dir, 'vf.c')]);
  return join(dir, 'vf');
}

/** Starts a process that holds ~200 MB, for a restore that takes a while; /tmp/held once it does. */
const HOLD_200MB =
  'sh -c \'x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo held > /tmp/held; while true; do sleep 1; done\' >/dev/null 2>&1 & while [ ! -e /tmp/held ]; do sleep 0.1; done';

/** Waits until `done` holds, polling; fails naming `what` after many tries. */
async function until(what: string, done: () => boolean): Promise<void> {
  for (let i = 0; !done(); i++) {
    if (i > 600) throw new Error(`never: ${what}`);
    await sleep(50);
  }
}

/** The pids of `pid`'s children (every thread's). */
function childrenOf(pid: number): number[] {
  return readdirSync(`/proc/${pid}/task`).flatMap((task) =>
    readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8').split(' ').filter(Boolean).map(Number),
  );
}

type AdoptedSandboxes = Awaited<ReturnType<Awaited<ReturnType<typeof Platform.local>>['adoptSandboxes']>>;

/**
 * A durable sandbox's owner in a process of its own runs `owner` (with `platform` defined; it
 * logs the sandbox's id as JSON) and is SIGKILLed while the CRIU run of its whose command line
 * holds `verb` runs, once `killWhen` holds. When that run has ended, a successor on the same data
 * dir adopts what it can and `check` looks at it; then gc reaps the rest, as a node does. Returns
 * the mounts left under the sandboxes' folder, which it then removes with everything else.
 */
async function killOwnerDuringCriu(options: {
  dataDir: string;
  owner: string;
  env: Record<string, string>;
  verb: 'dump' | 'restore';
  killWhen?: () => boolean;
  check: (adopted: AdoptedSandboxes, id: string) => Promise<void>;
}): Promise<string[]> {
  const { dataDir } = options;
  const script = `
const { Platform } = await import(${JSON.stringify(resolve('dist/src/index.js'))});
const platform = await Platform.local({ dataDir: process.env.DATA, storeDir: process.env.STORE, durable: true });
${options.owner}
setInterval(() => undefined, 1000);
`;
  const owner = spawn(process.execPath, ['--input-type=module', '-e', script], {
    env: { ...process.env, ...options.env, DATA: dataDir, STORE: STORE_DIR },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  owner.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
  let successor: Awaited<ReturnType<typeof Platform.local>> | undefined;
  let left: string[] = [];
  try {
    await until('the owner made its sandbox', () => out.includes('\n'));
    const { id } = JSON.parse(out) as { id: string };
    let criuRun: number | undefined;
    await until(`the owner's CRIU ${options.verb}s`, () => {
      criuRun = childrenOf(owner.pid!).find((pid) =>
        readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').includes(options.verb),
      );
      return criuRun !== undefined && (options.killWhen?.() ?? true);
    });
    owner.kill('SIGKILL');
    // CRIU outlives its caller
    await until("the dead owner's CRIU ends", () => !existsSync(`/proc/${criuRun}`));
    successor = await Platform.local({ dataDir, storeDir: STORE_DIR, durable: true });
    await options.check(await successor.adoptSandboxes(), id);
  } finally {
    owner.kill('SIGKILL');
    await successor?.gc().catch(() => undefined);
    left = removeMountsUnder(join(dataDir, 'sandboxes'));
    await successor?.close().catch(() => undefined);
    removeMountsUnder(dataDir);
    await rm(dataDir, { recursive: true, force: true });
  }
  return left;
}

describe.skipIf(!criu.usable)('hibernation that keeps the network namespace, under attack', () => {
  // OPEN BREAK: two hibernations of one sandbox at once (a tenant's call beside the node's idle
  // policy or a run's preemption, or two of the tenant's) run two CRIU dumps of the same
  // processes; nothing serialises hibernate() per sandbox (the state check at its start passes
  // for both). Seen here, by which dump ends first: (a) both fail, both report `paused`, the
  // agent is dead and the sandbox failed (agent_crash); or (b) one dumps and reports
  // `hibernated`, the other fails and falls back to reclaim, which freezes the cgroup (and says
  // `paused`): the wake restores into the frozen cgroup, CRIU waits on frozen tasks for the whole
  // CRIU_TIMEOUT_MS (120 s, a CRIU slot of the node's taken), is SIGKILLed, the sandbox is lost,
  // and the killed CRIU leaves its cgroup yard (a tmpfs and a mount of every cgroup hierarchy)
  // mounted in the image folder: close then fails (EBUSY) and the mounts stay on the host.
  it.fails(
    'survive two hibernations at once: one hibernates, the sandbox wakes, nothing stays mounted',
    async () => {
      await using test = await createTestPlatform('red-hib-twice');
      const sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
      let left: string[] = [];
      try {
        const reports = await Promise.all([sandbox.hibernate(), sandbox.hibernate()]);
        expect(reports.map((r) => r.state)).toContain('hibernated');
        expect((await sandbox.exec(['echo', 'awake'])).stdout).toBe('awake\n');
      } finally {
        await sandbox.close().catch(() => undefined);
        left = removeMountsUnder(join(test.dataDir, 'sandboxes'));
      }
      expect(left).toEqual([]);
    },
  );

  it('hibernate twice in a row: the second is a no-op, and it wakes', async () => {
    await using test = await createTestPlatform('red-hib-twice-seq');
    const sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      expect((await sandbox.hibernate()).state).toBe('hibernated');
      expect(await sandbox.hibernate()).toMatchObject({ state: 'hibernated', freedBytes: 0 });
      expect(keptUnder(test.dataDir)).toHaveLength(1);
      expect((await sandbox.exec(['echo', 'awake'])).stdout).toBe('awake\n');
      expect(keptUnder(test.dataDir)).toEqual([]);
    } finally {
      await sandbox.close();
      expect(keptUnder(test.dataDir)).toEqual([]);
    }
  });

  it('let go of the kept namespace when a dump fails: a process CRIU cannot seize', async () => {
    await using test = await createTestPlatform('red-hib-unseizable');
    const sandbox = await test.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      await sandbox.writeFile('/root/vf', unseizableProgram());
      await sandbox.exec(['sh', '-c', 'chmod +x /root/vf; /root/vf >/dev/null 2>&1 &']);
      const report = await sandbox.hibernate();
      // no image: it fell back to reclaim (paused, or hibernated where the node has swap)
      expect(report.imageBytes).toBeUndefined();
      expect(keptUnder(test.dataDir)).toEqual([]);
      expect((await sandbox.exec(['echo', 'awake'])).stdout).toBe('awake\n');
    } finally {
      await sandbox.close();
      expect(keptUnder(test.dataDir)).toEqual([]);
    }
  });

  it('let go of the namespace a dead owner kept mid-dump: the successor adopts, close releases', async () => {
    const dataDir = join(TEST_DATA_ROOT, `red-hib-crash-${process.pid}`);
    // a dump of a sandbox CRIU cannot seize spends CRIU's seize timeout with the namespace
    // already held: the owner is killed then; CRIU gives up and lets the processes go
    const left = await killOwnerDuringCriu({
      dataDir,
      owner: `
const { readFileSync } = await import('node:fs');
const sandbox = await platform.createSandbox({ environment: 'busybox:latest' });
await sandbox.writeFile('/root/vf', readFileSync(process.env.VF));
await sandbox.exec(['sh', '-c', 'chmod +x /root/vf; /root/vf >/dev/null 2>&1 &']);
console.log(JSON.stringify({ id: sandbox.id }));
await sandbox.hibernate();`,
      env: { VF: unseizableProgramPath() },
      verb: 'dump',
      killWhen: () => keptUnder(dataDir).length === 1,
      check: async (adopted, id) => {
        expect(adopted.map((s) => [s.id, s.state])).toEqual([[id, 'running']]);
        expect((await adopted[0]!.exec(['echo', 'adopted'])).stdout).toBe('adopted\n');
        await adopted[0]!.close();
        expect(keptUnder(dataDir)).toEqual([]);
      },
    });
    expect(left).toEqual([]);
  });

  // OPEN BREAK: an owner killed while CRIU restores a hibernated sandbox (the overlay the restore
  // is rooted at is mounted at <sandbox dir>/rootfs, to be detached once CRIU is done) leaves that
  // overlay mounted: the successor adopts the restored processes and they work, but close (and
  // gc) never unmount it, the folder cannot go (EBUSY on rootfs), and the overlay and the layer
  // mount under it stay on the host after the sandbox is gone. removeContainerResidue lets go of
  // kept namespaces by mountinfo; the restore's overlay is not in its list. (The kept namespace
  // itself is let go.)
  it.fails(
    'outlive an owner killed mid-wake: the successor adopts what CRIU restored, close releases all',
    async () => {
      const dataDir = join(TEST_DATA_ROOT, `red-hib-crash-wake-${process.pid}`);
      const left = await killOwnerDuringCriu({
        dataDir,
        owner: `
const sandbox = await platform.createSandbox({ environment: 'busybox:latest', resources: { memoryMib: 512 } });
await sandbox.exec(['sh', '-c', process.env.HOLD]);
await sandbox.hibernate();
console.log(JSON.stringify({ id: sandbox.id }));
await sandbox.exec(['echo', 'woke']);`,
        env: { HOLD: HOLD_200MB },
        verb: 'restore',
        check: async (adopted, id) => {
          expect(adopted.map((s) => s.id)).toEqual([id]);
          expect((await adopted[0]!.exec(['cat', '/tmp/held'])).stdout).toBe('held\n');
          await adopted[0]!.close();
          expect(keptUnder(dataDir)).toEqual([]);
        },
      });
      expect(left).toEqual([]);
    },
  );

  // OPEN BREAK: an owner killed while CRIU dumps a durable sandbox to hibernate it loses the
  // sandbox. CRIU outlives its caller, finishes the image and ends the processes, but the record
  // names the image only after the dump returns: the successor finds no process and no image
  // ("none of its processes is left") and leaves the sandbox to gc, which removes it, image and
  // all. The image was whole; a record written before the dump (naming an image in progress,
  // checked for CRIU's inventory at adoption) would let the successor restore it.
  it.fails(
    'outlive an owner killed mid-dump: the successor restores the sandbox from its image',
    async () => {
      const left = await killOwnerDuringCriu({
        dataDir: join(TEST_DATA_ROOT, `red-hib-crash-dump-${process.pid}`),
        owner: `
const sandbox = await platform.createSandbox({ environment: 'busybox:latest', resources: { memoryMib: 512 } });
await sandbox.exec(['sh', '-c', process.env.HOLD]);
console.log(JSON.stringify({ id: sandbox.id }));
await sandbox.hibernate();`,
        env: { HOLD: HOLD_200MB },
        verb: 'dump',
        check: async (adopted, id) => {
          expect(adopted.map((s) => s.id)).toEqual([id]);
          expect((await adopted[0]!.exec(['cat', '/tmp/held'])).stdout).toBe('held\n');
          await adopted[0]!.close();
        },
      });
      expect(left).toEqual([]);
    },
  );

  it("keep a hibernated sandbox's namespace its own while a neighbour is created, wakes and forks", async () => {
    await using test = await createTestPlatform('red-hib-neighbours');
    const victim = await test.platform.createSandbox({ environment: 'busybox:latest' });
    const neighbour = await test.platform.createSandbox({ environment: 'busybox:latest' });
    const namespaceOf = async (sandbox: typeof victim): Promise<string> =>
      (await sandbox.exec(['readlink', '/proc/self/ns/net'])).stdout;
    try {
      const victimNet = await namespaceOf(victim);
      expect((await victim.hibernate()).state).toBe('hibernated');
      // the neighbour's own hibernation, wake and fork (CRIU restores that build mount
      // namespaces beside the victim's kept mount), and a new container (runc's)
      expect((await neighbour.hibernate()).state).toBe('hibernated');
      const neighbourNet = await namespaceOf(neighbour);
      expect(neighbourNet).not.toBe(victimNet);
      {
        await using group = await test.platform.fork(neighbour, 1, { depth: 'memory' });
        expect(await namespaceOf(group.sandboxes[0]!)).not.toBe(victimNet);
      }
      const third = await test.platform.createSandbox({ environment: 'busybox:latest' });
      await third.close();
      // the victim's namespace is still held, and it wakes in it, the neighbour in its own
      expect(keptUnder(test.dataDir)).toHaveLength(1);
      expect(await namespaceOf(victim)).toBe(victimNet);
      expect(await namespaceOf(neighbour)).toBe(neighbourNet);
    } finally {
      await neighbour.close();
      await victim.close();
      expect(keptUnder(test.dataDir)).toEqual([]);
    }
  });
});

/** The mounts stacked on CRIU's kernel cache folder, bottom first. */
function cacheFolderMounts(): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((line) => line.split(' ')[4] === SANDGYM_CRIU_RUN_DIR);
}

describe.skipIf(!criu.usable || criuProgram() !== INSTALLED_CRIU)(
  "CRIU's kernel cache tmpfs, under attack",
  () => {
    // OPEN BREAK (minor): node processes that start at once after a reboot each detect CRIU, each
    // finds no tmpfs on the cache folder and each mounts one: the later hide the earlier, which
    // stay mounted, empty, on the host until it restarts (a tmpfs of 1 MiB each). The comment in
    // kernelCacheFolder accepts it; a mount under a lock, or a check of mountinfo after mounting
    // that unmounts the extra, would not leave them.
    it.fails('mount one tmpfs on the cache folder when nodes start at once', async () => {
      try {
        // many reboots' worth: the race is lost most times in a fresh process, less in a warm one
        const stacked: number[] = [];
        for (let reboot = 0; reboot < 20; reboot++) {
          // what a reboot leaves where /run is a disk: the folder, with no tmpfs on it
          while (cacheFolderMounts().length > 0) execFileSync('umount', [SANDGYM_CRIU_RUN_DIR]);
          const detected = await Promise.all([detectCriu(), detectCriu(), detectCriu(), detectCriu()]);
          expect(detected.every((d) => d.kernelCacheKept)).toBe(true);
          stacked.push(cacheFolderMounts().length);
        }
        expect(stacked.filter((mounts) => mounts !== 1)).toEqual([]);
      } finally {
        // one root-only tmpfs again, as other work on this host expects
        while (cacheFolderMounts().length > 1) execFileSync('umount', [SANDGYM_CRIU_RUN_DIR]);
        await detectCriu();
      }
    });

    it('mount one tmpfs on the cache folder when one node starts', async () => {
      try {
        while (cacheFolderMounts().length > 0) execFileSync('umount', [SANDGYM_CRIU_RUN_DIR]);
        expect(await detectCriu()).toMatchObject({ usable: true, kernelCacheKept: true });
        expect(await detectCriu()).toMatchObject({ usable: true, kernelCacheKept: true });
        expect(cacheFolderMounts()).toHaveLength(1);
      } finally {
        while (cacheFolderMounts().length > 1) execFileSync('umount', [SANDGYM_CRIU_RUN_DIR]);
        await detectCriu();
      }
    });
  },
);
