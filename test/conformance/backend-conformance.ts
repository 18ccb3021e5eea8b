import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  collectExec,
  type Backend,
  type BackendSandbox,
  type SandboxSpec,
} from '../../src/backends/index.ts';
import { newSandboxId } from '../../src/common/index.ts';
import { expectCode } from '../support/errors.ts';
import { TEST_DATA_ROOT, busyboxSpecFactory } from '../support/platform.ts';

/** How a backend joins the conformance suite. */
export interface ConformanceTarget {
  /** The backend's name, maybe followed by the variant under test in parentheses. */
  name: string;
  /** A ready backend plus a spec factory for a busybox-like environment. */
  open(): Promise<{ backend: Backend; spec(): SandboxSpec; dispose(): Promise<void> }>;
}

/**
 * A conformance target whose backend lives in a data folder of its own below the test root, on
 * busybox:latest; the folder goes when the suite ends. `open` makes the backend and says how to
 * close it (and whatever it stands on).
 */
export function targetInDataDir(
  name: string,
  open: (dataDir: string) => Promise<{ backend: Backend; close: () => Promise<void> }>,
  /** Resources the backend needs beyond the busybox defaults (a full OS's memory). */
  resources: Partial<SandboxSpec['resources']> = {},
): ConformanceTarget {
  return {
    name,
    async open() {
      const dataDir = join(TEST_DATA_ROOT, `conformance-${randomBytes(4).toString('hex')}`);
      const { backend, close } = await open(dataDir);
      const busybox = await busyboxSpecFactory();
      const spec = (): SandboxSpec => {
        const made = busybox();
        return { ...made, resources: { ...made.resources, ...resources } };
      };
      return {
        backend,
        spec,
        async dispose() {
          try {
            await close();
          } finally {
            await rm(dataDir, { recursive: true, force: true });
          }
        },
      };
    },
  };
}

/**
 * The contract every backend must keep. Where a capability flag says "no", the operation must
 * fail with `unsupported` instead of doing less.
 */
export function describeBackendConformance(target: ConformanceTarget): void {
  describe(`backend conformance: ${target.name}`, () => {
    let opened: Awaited<ReturnType<ConformanceTarget['open']>>;
    let sandbox: BackendSandbox;

    beforeAll(async () => {
      opened = await target.open();
      sandbox = await opened.backend.create(opened.spec());
    });

    afterAll(async () => {
      try {
        await sandbox?.close();
      } finally {
        await opened?.dispose();
      }
    });

    it('reports its name and capabilities', () => {
      expect(opened.backend.name).toBe(target.name.split(' (')[0]);
      expect(typeof opened.backend.capabilities.pause).toBe('boolean');
      expect(['none', 'disk', 'memory']).toContain(opened.backend.capabilities.checkpoint);
      expect(sandbox.state).toBe('running');
      expect(sandbox.id).toMatch(/^sg-/);
    });

    it('runs a command and collects stdout, stderr and the exit code', async () => {
      const result = await sandbox.exec(['sh', '-c', 'echo out; echo err >&2; exit 3']);
      expect(result).toMatchObject({
        exitCode: 3,
        signal: null,
        stdout: 'out\n',
        stderr: 'err\n',
        timedOut: false,
      });
      expect(result.durationMs).toBeGreaterThan(0);
    });

    it('passes cwd, env and stdin to the command', async () => {
      const result = await sandbox.exec(['sh', '-c', 'pwd; echo "$GREETING"; cat'], {
        cwd: '/tmp',
        env: { GREETING: 'hello' },
        stdin: 'from stdin',
      });
      expect(result.stdout).toBe('/tmp\nhello\nfrom stdin');
    });

    it('runs a command as another user', async () => {
      expect((await sandbox.exec(['id', '-u'], { user: 'nobody' })).stdout).toBe('65534\n');
      expect((await sandbox.exec(['sh', '-c', 'echo $(id -u):$(id -g)'], { user: '123:456' })).stdout).toBe(
        '123:456\n',
      );
      await expectCode(sandbox.exec(['id'], { user: 'no-such-user' }), 'invalid_argument');
    });

    it('gives a command a report channel its descendants inherit, and keeps what they wrote', async () => {
      // through /proc, since dash redirects only fds 0 to 9
      const script = [
        'echo "first from $$" > /proc/self/fd/$SANDGYM_REPORT_FD',
        'sh -c \'echo "from a child" > /proc/self/fd/$SANDGYM_REPORT_FD\'',
        'echo stdout',
      ].join('; ');
      const result = await sandbox.exec(['sh', '-c', script], { reportChannel: true });
      expect(result).toMatchObject({ exitCode: 0, stdout: 'stdout\n', reportTruncated: false });
      expect(result.report).toMatch(/^first from \d+\nfrom a child\n$/);
      expect(result.reportBytes).toBe(Buffer.byteLength(result.report ?? ''));
      const plain = await sandbox.exec([
        'sh',
        '-c',
        'echo "${SANDGYM_REPORT_FD:-none}"; echo x > /proc/self/fd/200',
      ]);
      expect(plain.stdout).toBe('none\n');
      expect(plain.exitCode).not.toBe(0);
      expect(plain.report).toBeUndefined();
    });

    it('reports a missing program as exit 127 with a message', async () => {
      const result = await sandbox.exec(['no-such-program-xyz']);
      expect(result.exitCode).toBe(127);
      expect(result.stderr).toContain('no-such-program-xyz');
    });

    it('streams output as it is produced, then the result', async () => {
      const running = sandbox.execStream(['sh', '-c', 'for i in 1 2 3; do echo line$i; sleep 0.05; done']);
      const chunks: string[] = [];
      for await (const chunk of running.output) chunks.push(chunk.data.toString());
      expect(chunks.length).toBeGreaterThanOrEqual(2);
      expect(chunks.join('')).toBe('line1\nline2\nline3\n');
      expect((await running.result).exitCode).toBe(0);
    });

    it('kills a command at its timeout, with its whole process group', async () => {
      const result = await sandbox.exec(['sh', '-c', 'sleep 30 & sleep 30'], { timeoutMs: 300 });
      expect(result.timedOut).toBe(true);
      expect(result.signal).toBe('SIGKILL');
      const left = await sandbox.exec(['sh', '-c', 'ps -o stat,comm | grep -v "^Z" | grep -c sleep || true']);
      expect(left.stdout.trim()).toBe('0');
    });

    it('caps captured output and says it truncated', async () => {
      const result = await sandbox.exec(['sh', '-c', 'head -c 100000 /dev/zero'], { outputCapBytes: 1000 });
      expect(result.stdoutTruncated).toBe(true);
      expect(result.stdoutBytes).toBe(100000);
      expect(result.stdout.length).toBe(1000);
    });

    it('cancels a command through an AbortSignal', async () => {
      const controller = new AbortController();
      const running = sandbox.exec(['sleep', '30'], { signal: controller.signal });
      setTimeout(() => controller.abort(), 100);
      await expectCode(running, 'cancelled');
    });

    it('runs commands concurrently', async () => {
      const results = await Promise.all(
        [1, 2, 3, 4].map((n) => sandbox.exec(['sh', '-c', `sleep 0.2; echo ${n}`])),
      );
      expect(results.map((r) => r.stdout.trim())).toEqual(['1', '2', '3', '4']);
    });

    it('writes, reads and lists files', async () => {
      const bytes = Buffer.from([0, 1, 2, 255, 10]);
      await sandbox.writeFile('/work/data/blob.bin', bytes, { mode: 0o600 });
      expect(Buffer.compare(await sandbox.readFile('/work/data/blob.bin'), bytes)).toBe(0);
      const entries = await sandbox.listDir('/work/data');
      expect(entries).toEqual([{ name: 'blob.bin', type: 'file', size: 5, mode: 0o600 }]);
      const seen = await sandbox.exec(['cat', '/work/data/blob.bin']);
      expect(seen.stdoutBytes).toBe(5);
    });

    it('rejects bad paths with typed errors', async () => {
      await expectCode(sandbox.readFile('/etc/../etc/passwd'), 'invalid_argument');
      await expectCode(sandbox.writeFile('relative/path', 'x'), 'invalid_argument');
      await expectCode(sandbox.readFile('/no/such/file'), 'not_found');
      await expectCode(sandbox.readFile('/tmp'), 'failed_precondition');
    });

    it('honours an abort on file calls', async () => {
      const aborted = AbortSignal.abort();
      await expectCode(sandbox.readFile('/etc/passwd', { signal: aborted }), 'cancelled');
      await expectCode(sandbox.listDir('/', { signal: aborted }), 'cancelled');
      expect((await sandbox.readFile('/etc/passwd', { timeoutMs: 10_000 })).length).toBeGreaterThan(0);
    });

    it('does not follow magic links out of the root', async () => {
      await sandbox.exec(['ln', '-sf', '/proc/1/root/etc/hostname', '/tmp/magic']);
      await expectCode(sandbox.readFile('/proc/1/root/etc/hostname'), 'permission_denied');
    });

    it('pauses and resumes, or says it cannot', async () => {
      if (!opened.backend.capabilities.pause) {
        await expectCode(sandbox.pause(), 'unsupported');
        return;
      }
      await sandbox.exec(['sh', '-c', 'echo before > /tmp/state']);
      await sandbox.pause();
      expect(sandbox.state).toBe('paused');
      expect((await sandbox.stats()).state).toBe('paused');
      await sandbox.resume();
      expect(sandbox.state).toBe('running');
      await sandbox.pause();
      // any request resumes a paused sandbox transparently
      expect((await sandbox.exec(['cat', '/tmp/state'])).stdout).toBe('before\n');
      expect(sandbox.state).toBe('running');
    });

    it("hibernates with its processes' memory intact, or says it cannot", async () => {
      if (!opened.backend.capabilities.hibernate) {
        await expectCode(sandbox.hibernate(), 'unsupported');
        return;
      }
      // a process holds 4 MB of known content in memory, and checks it when told to
      const holder = collectExec(
        sandbox.execStream([
          'sh',
          '-c',
          [
            'p=$(yes sandgym-pattern | head -c 4000000)',
            'before=$(echo "$p" | md5sum)',
            'touch /tmp/holding',
            'while [ ! -e /tmp/check ]; do sleep 0.05; done',
            '[ "$(echo "$p" | md5sum)" = "$before" ] && echo intact || echo changed',
          ].join('; '),
        ]),
      );
      while ((await sandbox.exec(['test', '-e', '/tmp/holding'])).exitCode !== 0) {
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      const report = await sandbox.hibernate();
      expect(report.freedBytes).toBeGreaterThanOrEqual(0);
      // hibernated when its memory left the node's memory; else only frozen, and it says why
      // (here a request is in flight, so a container cannot be dumped: swap is all it has)
      expect(sandbox.state).toBe(report.state);
      if (report.state === 'paused') expect(report.reason).toMatch(/resident/);
      // any request resumes it; the process finds its memory as it left it
      await sandbox.writeFile('/tmp/check', '');
      expect(sandbox.state).toBe('running');
      expect((await holder).stdout).toBe('intact\n');
    });

    it('measures its use', async () => {
      const stats = await sandbox.stats();
      expect(stats.memoryBytes).toBeGreaterThan(0);
      expect(stats.pids).toBeGreaterThanOrEqual(1);
      expect(stats.cpuUsageMs).toBeGreaterThan(0);
    });

    it('lists a sandbox and destroys it idempotently', async () => {
      const spec = { ...opened.spec(), id: newSandboxId('local') };
      const extra = await opened.backend.create(spec);
      expect((await opened.backend.list()).map((r) => r.id)).toContain(spec.id);
      await extra.close();
      await extra.close();
      expect(extra.state).toBe('stopped');
      await expectCode(extra.exec(['true']), 'failed_precondition');
      expect((await opened.backend.list()).map((r) => r.id)).not.toContain(spec.id);
    });
  });
}
