import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { hostProgram, runProgram } from '../src/backends/index.ts';

/**
 * A layer store behind a network link: the store folder is served over SFTP by an sshd on
 * 127.0.0.1, mounted with sshfs, and the server's replies go through an HTB class on the
 * loopback device limited to `rateMbit`. This kernel has no NFS, dm-delay or netem, and cgroup
 * v1 blkio limits are per cgroup rather than shared, so this is the real shared link we can
 * build here: every byte a node reads from the store crosses it, and its counter says how many.
 */
export class ShapedStore implements AsyncDisposable {
  private constructor(
    private readonly dir: string,
    private readonly exportDir: string,
    readonly mountPoint: string,
    private readonly sshdPid: number,
  ) {}

  static readonly PORT = 2299;

  static async start(exportDir: string, workDir: string, rateMbit: number): Promise<ShapedStore> {
    const keys = join(workDir, 'keys');
    await mkdir(keys, { recursive: true });
    await mkdir('/run/sshd', { recursive: true });
    for (const name of ['host', 'client']) {
      await runProgram('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(keys, name)]);
    }
    await writeFile(join(keys, 'authorized_keys'), await readFile(join(keys, 'client.pub')));
    const config = join(workDir, 'sshd_config');
    await writeFile(
      config,
      [
        `ListenAddress 127.0.0.1:${ShapedStore.PORT}`,
        `HostKey ${join(keys, 'host')}`,
        `AuthorizedKeysFile ${join(keys, 'authorized_keys')}`,
        'PermitRootLogin prohibit-password',
        'PasswordAuthentication no',
        'StrictModes no',
        'UsePAM no',
        'Subsystem sftp internal-sftp',
        `PidFile ${join(workDir, 'sshd.pid')}`,
        '',
      ].join('\n'),
    );
    await runProgram(hostProgram('sshd'), ['-f', config, '-E', join(workDir, 'sshd.log')]);
    // sshd writes its pid file from the daemon it forks, after the command above has returned
    const pid = await waitForPid(join(workDir, 'sshd.pid'));
    const store = new ShapedStore(workDir, exportDir, join(workDir, 'mnt'), pid);
    try {
      await shapeLoopback(rateMbit);
      await store.mount();
    } catch (error) {
      await store[Symbol.asyncDispose]();
      throw error;
    }
    return store;
  }

  /**
   * (Re)mounts the store, so a run starts with nothing of it cached on the client. Writable, as a
   * node's shared store is: a node checks that it may write its store (its layer pins go there).
   */
  async mount(): Promise<void> {
    await this.unmount();
    await mkdir(this.mountPoint, { recursive: true });
    const key = join(this.dir, 'keys', 'client');
    await runProgram('sshfs', [
      '-o',
      `port=${ShapedStore.PORT},IdentityFile=${key},StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,Ciphers=aes128-gcm@openssh.com`,
      `root@127.0.0.1:${this.exportDir}`,
      this.mountPoint,
    ]);
  }

  async unmount(): Promise<void> {
    await runProgram('fusermount', ['-u', this.mountPoint]).catch(() => undefined);
  }

  /** Bytes the store has sent over the shaped link so far. */
  async bytesSent(): Promise<number> {
    const text = await runProgram('tc', ['-s', 'class', 'show', 'dev', 'lo', 'classid', '1:20']);
    return Number(/Sent (\d+) bytes/.exec(text)?.[1] ?? 0);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.unmount();
    await runProgram('tc', ['qdisc', 'del', 'dev', 'lo', 'root']).catch(() => undefined);
    // read again: the file is the truth if the start-up read raced the daemon
    const pid = this.sshdPid || (await waitForPid(join(this.dir, 'sshd.pid')));
    if (pid > 0) {
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        // already gone
      }
    }
  }
}

/** The pid in a daemon's pid file, waiting up to 5 s for the file to appear; 0 if it never does. */
async function waitForPid(path: string): Promise<number> {
  for (let i = 0; i < 100; i++) {
    const pid = Number((await readFile(path, 'utf8').catch(() => '')).trim());
    if (pid > 0) return pid;
    await sleep(50);
  }
  return 0;
}

/** Everything the SFTP server sends (source port PORT) goes through one rate-limited class. */
async function shapeLoopback(rateMbit: number): Promise<void> {
  await runProgram('tc', ['qdisc', 'del', 'dev', 'lo', 'root']).catch(() => undefined);
  const steps = [
    ['qdisc', 'add', 'dev', 'lo', 'root', 'handle', '1:', 'htb', 'default', '10'],
    ['class', 'add', 'dev', 'lo', 'parent', '1:', 'classid', '1:10', 'htb', 'rate', '100gbit'],
    [
      'class',
      'add',
      'dev',
      'lo',
      'parent',
      '1:',
      'classid',
      '1:20',
      'htb',
      'rate',
      `${rateMbit}mbit`,
      'ceil',
      `${rateMbit}mbit`,
    ],
    [
      'filter',
      'add',
      'dev',
      'lo',
      'parent',
      '1:',
      'protocol',
      'ip',
      'prio',
      '1',
      'u32',
      'match',
      'ip',
      'sport',
      String(ShapedStore.PORT),
      '0xffff',
      'flowid',
      '1:20',
    ],
  ];
  for (const step of steps) await runProgram('tc', step);
}
