import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { expect } from 'vitest';
import type { StepSignals } from '../../src/env/index.ts';
import type { Sandbox, SandboxRequest } from '../../src/platform/index.ts';

/** What an attack's step showed. */
export interface AttackResult {
  exitCode: number | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  oomKilled: boolean;
  signals: StepSignals;
}

/** What an attack's checks may use besides its result. */
export interface AttackContext {
  sandbox: Sandbox;
  /** The stand-in mirror in its own network namespace, and a listener on the node itself. */
  upstream: string;
  hostPort: number;
  /** A layer build from an archive the sandbox made: what an upload does with it. */
  ingestTar: (archive: Buffer) => Promise<unknown>;
}

/** One attack, run from inside a sandbox as a single step, with the containment it must meet. */
export interface Attack {
  name: string;
  kind: 'resource' | 'escape' | 'platform' | 'network';
  /** The sandbox it runs in (busybox unless it names another environment). */
  request?: SandboxRequest;
  /** The attack: a shell script run as root in the sandbox. */
  script: string | ((context: { upstream: string; hostPort: number }) => string);
  timeoutMs?: number;
  /** That it failed or stayed within limits. */
  contained(result: AttackResult, context: AttackContext): Promise<void> | void;
  /** The signal it must raise, if any. */
  signal?: (signals: StepSignals) => boolean;
}

const DEBIAN = 'debian:bookworm';

/** Every line that ends "rc=N" in the output: a script's verdicts on its own attempts. */
function failedEveryAttempt(result: AttackResult): void {
  const verdicts = [...result.stdout.matchAll(/rc=(\d+)/g)].map((m) => Number(m[1]));
  expect(verdicts.length, result.stdout + result.stderr).toBeGreaterThan(0);
  expect(
    verdicts.filter((rc) => rc === 0),
    result.stdout + result.stderr,
  ).toEqual([]);
}

/** A Python snippet run by the script (Debian has python3; busybox does not). */
function python(code: string): string {
  return `python3 - <<'PY'\n${code}\nPY`;
}

const hit = (limit: StepSignals['limitsHit'][number]) => (signals: StepSignals) =>
  signals.limitsHit.includes(limit);

export const ATTACKS: Attack[] = [
  // ---- resource attacks
  {
    name: 'fork bomb',
    kind: 'resource',
    request: { resources: { pids: 64 } },
    script: 'bomb() { bomb | bomb & }; bomb; sleep 2; kill -9 -1 2>/dev/null; true',
    timeoutMs: 20_000,
    async contained(_result, { sandbox }) {
      expect((await sandbox.stats()).pids).toBeLessThanOrEqual(64);
    },
    signal: hit('pids'),
  },
  {
    name: 'memory bomb',
    kind: 'resource',
    request: { resources: { memoryMib: 64 } },
    script: 'tail /dev/zero',
    timeoutMs: 60_000,
    contained(result) {
      expect(result.oomKilled).toBe(true);
    },
    signal: hit('memory'),
  },
  {
    name: 'disk fill with dd',
    kind: 'resource',
    request: { resources: { diskMib: 64 } },
    script: 'dd if=/dev/zero of=/root/fill bs=1M count=512; echo rc=$?',
    timeoutMs: 60_000,
    async contained(result, { sandbox }) {
      expect(result.stderr).toMatch(/quota exceeded|No space left/i);
      expect(result.stdout).toMatch(/rc=1/);
      expect((await sandbox.stats()).diskBytes).toBeLessThanOrEqual(64 * 2 ** 20);
    },
    signal: hit('disk'),
  },
  {
    name: 'inode exhaustion',
    kind: 'resource',
    request: { resources: { diskMib: 16 } },
    // xargs gives up at the first batch touch cannot finish (exit 255), as a real attack would not
    script:
      'mkdir -p /root/i && cd /root/i && seq 1 2000000 | xargs sh -c \'touch "$@" || exit 255\' sh 2>/dev/shm/err; grep -m1 -i -o "quota exceeded\\|no space left" /dev/shm/err; ls | wc -l',
    timeoutMs: 120_000,
    contained(result) {
      expect(result.stdout).toMatch(/quota exceeded|No space left/i);
      expect(Number(result.stdout.trim().split('\n').pop())).toBeLessThan(2_000_000);
    },
    signal: hit('disk'),
  },
  {
    name: 'yes flood on stdout',
    kind: 'resource',
    request: { resources: { outputCapBytes: 64 * 1024 } },
    script: 'timeout 3 yes',
    contained(result) {
      expect(result.stdout.length).toBeLessThanOrEqual(64 * 1024);
    },
    signal: hit('output'),
  },
  {
    name: 'yes flood into a file',
    kind: 'resource',
    request: { resources: { diskMib: 32 } },
    script: 'timeout 60 yes > /root/yes.txt; ls -l /root/yes.txt',
    timeoutMs: 90_000,
    async contained(_result, { sandbox }) {
      expect((await sandbox.stats()).diskBytes).toBeLessThanOrEqual(32 * 2 ** 20);
    },
    signal: hit('disk'),
  },
  {
    name: 'sleeping child left behind to outlive the step',
    kind: 'resource',
    script: 'setsid sleep 1000 >/dev/null 2>&1 & sleep 1000 >/dev/null 2>&1 & echo started',
    contained(result) {
      expect(result.stdout).toContain('started');
    },
    signal: (signals) => signals.leftoverProcesses >= 2,
  },
  {
    name: 'recursive grep through /proc',
    kind: 'resource',
    script: 'timeout 20 grep -r secret /proc /sys >/dev/null 2>&1; echo done',
    timeoutMs: 40_000,
    contained(result) {
      expect(result.stdout).toContain('done');
    },
  },
  // ---- escape attempts
  {
    name: 'kill -9 -1',
    kind: 'escape',
    // kill(-1) spares the caller and pid 1 (the agent, as the runner's next step shows)
    script: 'sleep 60 & kill -9 -1; wait $!; echo "sleep ended: $?"',
    contained(result) {
      expect(result.stdout).toBe('sleep ended: 137\n'); // 128 + SIGKILL
    },
  },
  {
    name: 'mount a filesystem',
    kind: 'escape',
    script:
      'mount -t tmpfs none /mnt; echo rc=$?; mount --bind / /mnt; echo rc=$?; mount -o remount,rw /sys; echo rc=$?',
    contained: failedEveryAttempt,
  },
  {
    name: 'umount /proc to unmask it',
    kind: 'escape',
    script: 'umount /proc/kcore; echo rc=$?; umount -l /proc; echo rc=$?; umount /sys/fs/cgroup; echo rc=$?',
    contained: failedEveryAttempt,
  },
  {
    name: 'pivot_root',
    kind: 'escape',
    script: 'mkdir -p /new/old; pivot_root /new /new/old; echo rc=$?',
    contained: failedEveryAttempt,
  },
  {
    name: 'mknod a disk',
    kind: 'escape',
    script: 'mknod /tmp/sda b 8 0; echo rc=$?; mknod /tmp/mem c 1 1; echo rc=$?',
    contained: failedEveryAttempt,
  },
  {
    name: 'device nodes beyond the safe set',
    kind: 'escape',
    script: 'find /dev -type b -o -type c | sort',
    contained(result) {
      const allowed = [
        '/dev/full',
        '/dev/null',
        '/dev/ptmx',
        '/dev/random',
        '/dev/tty',
        '/dev/urandom',
        '/dev/zero',
      ];
      const found = result.stdout
        .trim()
        .split('\n')
        .filter((path) => path && !path.startsWith('/dev/pts/'));
      expect(found.filter((path) => !allowed.includes(path))).toEqual([]);
    },
  },
  {
    name: 'ptrace the agent',
    kind: 'escape',
    request: { environment: DEBIAN },
    script: python(`
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE of the agent (pid 1)
    rc = libc.ptrace(request, 1, 0, 0)
    print("rc=%d" % (0 if rc == 0 else 1), os.strerror(ctypes.get_errno()))
for path in ("/proc/1/mem", "/proc/1/environ"):
    try:
        open(path, "rb").read(16); print("rc=0 read", path)
    except OSError as e:
        print("rc=1", path, e.strerror)
`),
    contained: failedEveryAttempt,
  },
  {
    name: 'unshare -U to regain capabilities',
    kind: 'escape',
    script:
      "unshare -U -r sh -c 'mount -t tmpfs x /mnt'; echo rc=$?; unshare -m sh -c true; echo rc=$?; unshare -n true; echo rc=$?",
    contained: failedEveryAttempt,
  },
  {
    name: 'write to a cgroup',
    kind: 'escape',
    script: [
      'echo max > /sys/fs/cgroup/pids/pids.max; echo rc=$?',
      'echo 100000000000 > /sys/fs/cgroup/memory/memory.limit_in_bytes; echo rc=$?',
      'mkdir /sys/fs/cgroup/pids/escape; echo rc=$?',
      'echo $$ > /sys/fs/cgroup/unified/cgroup.procs 2>/dev/null; echo rc=$?',
    ].join('\n'),
    async contained(result, { sandbox }) {
      failedEveryAttempt(result);
      expect((await sandbox.exec(['cat', '/sys/fs/cgroup/pids/pids.max'])).stdout.trim()).not.toBe('max');
    },
  },
  {
    name: '/proc/sysrq-trigger',
    kind: 'escape',
    // "h" only prints help to the kernel log: harmless even if the write got through
    script: 'echo h > /proc/sysrq-trigger; echo rc=$?; echo 1 > /proc/sys/kernel/sysrq; echo rc=$?',
    contained: failedEveryAttempt,
  },
  {
    name: '/proc/kpagecgroup and kcore reads',
    kind: 'escape',
    script:
      'for f in /proc/kpagecgroup /proc/kpageflags /proc/kcore /proc/keys /proc/timer_list; do echo "$f $(head -c 64 $f 2>/dev/null | wc -c)"; done',
    contained(result) {
      for (const line of result.stdout.trim().split('\n')) expect(line).toMatch(/ 0$/);
    },
  },
  {
    name: 'change the hostname',
    kind: 'escape',
    script: 'hostname evil; echo rc=$?; echo evil > /proc/sys/kernel/hostname; echo rc=$?',
    contained(result) {
      failedEveryAttempt(result);
      expect(hostname()).not.toBe('evil');
    },
  },
  {
    name: 'set the clock',
    kind: 'escape',
    // busybox date exits 0 even when it cannot set the clock: the year it reads back decides
    // (rc=0: it reads 2001, the attack worked)
    script:
      'date -s \'2001-01-01 00:00:00\'; [ "$(date +%Y)" = 2001 ]; echo rc=$?; hwclock -s 2>/dev/null; echo rc=$?',
    contained(result) {
      failedEveryAttempt(result);
      expect(new Date().getFullYear()).toBeGreaterThan(2001);
    },
  },
  {
    name: 'chroot escape',
    kind: 'escape',
    request: { environment: DEBIAN },
    script: python(`
import os
open("/sandbox-marker", "w").write("inside")
os.makedirs("/jail", exist_ok=True)
keep = os.open("/", os.O_RDONLY)
os.chroot("/jail")
os.fchdir(keep)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
print("escaped to host" if not os.path.exists("/sandbox-marker") else "still in the sandbox")
print("host data dir visible" if os.path.exists("/work") or os.path.exists("/proc/1/root/work") else "no host paths")
`),
    contained(result) {
      expect(result.stdout).toContain('still in the sandbox');
      expect(result.stdout).toContain('no host paths');
    },
  },
  {
    name: 'freeze the filesystem through an ioctl',
    kind: 'escape',
    request: { environment: DEBIAN },
    script: python(`
import fcntl, os
FIFREEZE = 0xC0045877
for path in ("/", "/root", "/dev/shm"):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FIFREEZE, 0); print("rc=0 froze", path)
    except OSError as e:
        print("rc=1", path, e.strerror)
`),
    async contained(result, { sandbox }) {
      failedEveryAttempt(result);
      expect((await sandbox.exec(['sh', '-c', 'echo ok > /root/after && cat /root/after'])).stdout).toBe(
        'ok\n',
      );
    },
  },
  // ---- attacks on the platform
  {
    name: 'replace /bin/sh',
    kind: 'platform',
    script:
      "rm -f /bin/sh && printf '#!/bin/busybox ash\\necho pwned\\n' > /bin/sh && chmod +x /bin/sh; echo replaced",
    async contained(_result, { sandbox }) {
      // the agent needs no shell; the host's and the shared layer's /bin/sh are untouched
      expect((await sandbox.exec(['echo', 'agent runs'])).stdout).toBe('agent runs\n');
      expect(readFileSync('/bin/sh').subarray(0, 4).toString('latin1')).toBe('\x7fELF');
    },
    signal: (signals) => signals.protectedChanges.includes('/bin/sh'),
  },
  {
    name: 'replace /usr/bin/env',
    kind: 'platform',
    request: { environment: DEBIAN },
    script: "printf '#!/bin/sh\\necho forged\\n' > /usr/bin/env; chmod +x /usr/bin/env; echo replaced",
    contained() {
      expect(readFileSync('/usr/bin/env').subarray(0, 4).toString('latin1')).toBe('\x7fELF');
    },
    signal: (signals) => signals.protectedChanges.includes('/usr/bin/env'),
  },
  {
    name: 'replace the agent binary',
    kind: 'platform',
    script: 'cp /bin/busybox /dev/.sandgym-agent; echo rc=$?; rm -f /dev/.sandgym-agent; echo rc=$?',
    // the runner's next step checks that the agent still answers
    contained: failedEveryAttempt,
  },
  {
    name: 'forge requests on the agent channel',
    kind: 'platform',
    script:
      'for fd in $(ls /proc/1/fd); do printf "\\x00\\x00\\x00\\x10forged" > /proc/1/fd/$fd; echo rc=$?; done',
    // the runner's next step checks that the agent still answers
    contained: failedEveryAttempt,
  },
  {
    name: 'read the agent channel and find its files',
    kind: 'platform',
    script:
      'for fd in $(ls /proc/1/fd); do timeout 1 cat /proc/1/fd/$fd >/dev/null; echo rc=$?; done; echo "fifos: $(find / -xdev -type p 2>/dev/null | wc -l)"',
    contained(result) {
      failedEveryAttempt(result);
      expect(result.stdout).toContain('fifos: 0');
    },
  },
  {
    name: 'symlinks out of the sandbox against the file API',
    kind: 'platform',
    script:
      'ln -sf /proc/1/root/../../../../etc/hostname /root/escape; ln -sfn /etc /root/etc-link; echo planted',
    async contained(_result, { sandbox }) {
      const read = await sandbox.readFile('/root/escape').then(
        (data) => data.toString(),
        () => '',
      );
      expect(read.trim()).not.toBe(hostname());
      await sandbox.writeFile('/root/etc-link/planted-by-api', 'x');
      expect(existsSync('/etc/planted-by-api')).toBe(false);
      expect((await sandbox.exec(['cat', '/etc/planted-by-api'])).stdout).toBe('x');
    },
  },
  {
    name: '.. in paths given to the file API',
    kind: 'platform',
    script: 'echo planted > /root/dots; echo ok',
    async contained(_result, { sandbox }) {
      for (const path of ['/../../../../etc/hostname', '/root/../../etc/passwd', '/root/./../..']) {
        const outcome = await sandbox.readFile(path).then(
          () => 'read',
          (error: { code?: string }) => error.code,
        );
        expect(outcome, path).toBe('invalid_argument');
      }
    },
  },
  {
    name: 'tar-slip through an upload',
    kind: 'platform',
    request: { environment: DEBIAN },
    script: python(`
import io, tarfile
with tarfile.open("/root/upload.tar", "w") as tar:
    for name, kind, target in (("link", tarfile.SYMTYPE, "/tmp"), ("link/slipped", tarfile.REGTYPE, ""),
                               ("../../../tmp/slipped-dots", tarfile.REGTYPE, "")):
        info = tarfile.TarInfo(name); info.type = kind; info.linkname = target
        data = b"pwned"; info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
print("made")
`),
    async contained(_result, { sandbox, ingestTar }) {
      const archive = await sandbox.readFile('/root/upload.tar');
      const outcome = await ingestTar(archive).then(
        () => 'accepted',
        (error: { code?: string; message?: string }) => `${error.code}: ${error.message}`,
      );
      expect(outcome).toMatch(/^invalid_argument: .*refused/);
      expect(existsSync('/tmp/slipped')).toBe(false);
      expect(existsSync('/tmp/slipped-dots')).toBe(false);
    },
  },
  // ---- network attacks
  {
    name: 'raw and packet sockets',
    kind: 'network',
    request: { environment: DEBIAN },
    script: python(`
import socket
for family, kind, proto in ((socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
                            (socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
                            (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)):
    try:
        socket.socket(family, kind, proto); print("rc=0 opened", family, kind)
    except OSError as e:
        print("rc=1", family, kind, e.strerror)
`),
    contained: failedEveryAttempt,
  },
  {
    name: 'port scan with no network',
    kind: 'network',
    script: ({ upstream }) =>
      `for p in $(seq 8070 8099); do nc -w 1 ${upstream} $p </dev/null >/dev/null 2>&1 && echo open $p; done; echo scanned`,
    timeoutMs: 60_000,
    contained(result) {
      expect(result.stdout).not.toContain('open');
    },
    signal: (signals) => signals.deniedEgress >= 30,
  },
  {
    name: 'port scan past the mirror its policy allows',
    kind: 'network',
    request: { network: ['mirror:test'] },
    script: ({ upstream }) =>
      `for p in $(seq 8070 8099); do nc -w 1 ${upstream} $p </dev/null >/dev/null 2>&1 && echo open $p; done; echo scanned`,
    timeoutMs: 90_000,
    contained(result) {
      // only the port the rule names answers
      expect(result.stdout.match(/open \d+/g) ?? []).toEqual(['open 8080']);
    },
    signal: (signals) => signals.deniedEgress >= 29,
  },
  {
    name: 'a listener on the node the policy does not allow',
    kind: 'network',
    request: { network: ['mirror:test'] },
    script: ({ hostPort }) =>
      `gw=$(ip route | awk '/default/ {print $3}'); nc -w 2 $gw ${hostPort} </dev/null; echo rc=$?; nc -w 2 127.0.0.1 ${hostPort} </dev/null; echo rc=$?`,
    timeoutMs: 30_000,
    contained(result) {
      failedEveryAttempt(result);
      expect(result.stdout).not.toContain('node secret');
    },
    signal: (signals) => signals.deniedEgress >= 1,
  },
  {
    name: 'change its own address or routes',
    kind: 'network',
    request: { network: ['mirror:test'] },
    script:
      'ip addr add 10.0.0.99/8 dev eth0; echo rc=$?; ip route add 0.0.0.0/1 dev eth0; echo rc=$?; ip link set eth0 address 02:00:00:00:00:01; echo rc=$?',
    contained: failedEveryAttempt,
  },
];
