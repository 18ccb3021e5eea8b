import { cp, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backends/index.ts';
import {
  SandboxEnv,
  TaskEnv,
  loadHarborTask,
  type SandboxAction,
  type SandboxObservation,
} from '../../src/env/index.ts';
import type { Environment as GymEnvironment } from '../../src/env/environment.ts';
import { Platform, type Sandbox } from '../../src/platform/index.ts';
import { ENVS, WireClient } from '../../src/platform/wire/index.ts';
import { expectCode } from '../support/errors.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT, createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const TASK = resolve('test/hostile/tasks/agent-user');
const CLI = join(packageRoot(), 'dist', 'src', 'cli', 'main.js');

/** What an observation of a step is, for the checks below. */
type Observed = SandboxObservation | { type: 'task'; instruction: string; sandboxId: string };

/**
 * A task whose agent runs as `app` (uid 1000, in `crew` through /etc/group), with root's secrets
 * planted around it (see tasks/agent-user). Whatever door the agent uses, it acts as app: never
 * with root's powers, and with exactly the groups the files give it.
 */
describe('task users under attack', () => {
  let env: TestPlatform;
  let task: TaskEnv;
  /** The agent's sandbox, for the platform's own (root) look at what the agent did. */
  let sandbox: Sandbox;
  /** The task's built environment (`USER` root; the task names its agent user). */
  let environment: string;
  let passwdBefore: string;
  let groupBefore: string;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-task-users');
    task = TaskEnv.create(env.platform, await loadHarborTask(TASK));
    await task.reset();
    sandbox = task.sandbox!;
    environment = sandbox.labels['environment']!;
    passwdBefore = await asRoot('cat /etc/passwd');
    groupBefore = await asRoot('cat /etc/group');
  });

  afterAll(async () => {
    await task?.close();
    await env?.[Symbol.asyncDispose]();
  });

  /** A command as root: the platform's view, not the agent's. */
  async function asRoot(command: string): Promise<string> {
    const result = await sandbox.exec(['sh', '-c', command]);
    expect(result.exitCode, result.stderr).toBe(0);
    return result.stdout;
  }

  async function observe(
    gym: GymEnvironment<SandboxAction, Observed>,
    action: SandboxAction,
  ): Promise<Observed> {
    const { observation, outcome } = await gym.step(action);
    expect(outcome).toEqual({ kind: 'ok' });
    return observation;
  }

  /** Steps `action` and expects the kernel's refusal, whatever the door. */
  async function refused(
    gym: GymEnvironment<SandboxAction, Observed>,
    action: SandboxAction,
    code = 'permission_denied',
  ): Promise<void> {
    const observation = await observe(gym, action);
    expect(observation, JSON.stringify(action)).toMatchObject({ type: 'error', code });
  }

  async function shell(gym: GymEnvironment<SandboxAction, Observed>, command: string, session?: string) {
    const observation = await observe(gym, { type: 'exec', command, ...(session ? { session } : {}) });
    if (observation.type !== 'exec') throw new Error(`not an exec: ${JSON.stringify(observation)}`);
    return observation;
  }

  async function rootFilesUntouched(): Promise<void> {
    expect(await asRoot('cat /etc/passwd')).toBe(passwdBefore);
    expect(await asRoot('cat /etc/group')).toBe(groupBefore);
    expect(await asRoot('ls -A /etc/sudoers.d; ls -A /root')).toBe('secret\n');
    // no temp file of a refused write is left anywhere
    expect(await asRoot("find / -xdev -name '.sandgym-write-*' 2>/dev/null")).toBe('');
  }

  it('refuses the agent root-only files', () =>
    attack('users', 'read_file of /etc/shadow, 0600 and 0700 root files', async () => {
      for (const path of ['/etc/shadow', '/root/secret', '/srv/vault/inside', '/home/app/../../root/secret'])
        await refused(task, { type: 'read_file', path }, path.includes('..') ? 'invalid_action' : undefined);
    }));

  it('refuses writes of root-owned files and into root-owned folders', () =>
    attack('users', 'write_file of /etc/passwd, /etc/group, /etc/sudoers.d, /root', async () => {
      for (const path of [
        '/etc/passwd',
        '/etc/group',
        '/etc/sudoers.d/app',
        '/root/.profile',
        '/root/secret',
      ])
        await refused(task, { type: 'write_file', path, content: 'app:x:0:0::/root:/bin/sh\n' });
      await rootFilesUntouched();
      expect((await shell(task, 'id -u')).stdout).toBe('1000\n');
    }));

  it('makes no parent folder under a root-owned one', () =>
    attack('users', 'write_file creating parents under root folders', async () => {
      for (const path of ['/etc/cron.d/x/job', '/opt/new/deep/file', '/usr/local/bin/sub/tool', '/root/a/b'])
        await refused(task, { type: 'write_file', path, content: 'x' });
      expect(await asRoot('ls -d /etc/cron.d /opt/new /usr/local/bin/sub /root/a 2>/dev/null; true')).toBe(
        '',
      );
    }));

  it('refuses listings of 0700 root folders', () =>
    attack('users', 'list_dir of 0700 root folders', async () => {
      for (const path of ['/root', '/srv/vault']) await refused(task, { type: 'list_dir', path });
    }));

  it('follows its own symlinks with its own rights only', () =>
    attack('users', 'symlinks into root files and folders', async () => {
      const made = await shell(
        task,
        'ln -s /root /home/app/r && ln -s /etc /home/app/e && ln -s /root/secret /home/app/s && ln -s /srv/vault /srv/work/v',
      );
      expect(made.exitCode, made.stderr).toBe(0);
      for (const path of ['/home/app/r/secret', '/home/app/s', '/srv/work/v/inside']) {
        const observation = await observe(task, { type: 'read_file', path });
        expect(observation, path).toMatchObject({ type: 'error' });
      }
      for (const path of ['/home/app/r', '/srv/work/v']) await refused(task, { type: 'list_dir', path });
      for (const path of ['/home/app/e/passwd', '/home/app/e/sudoers.d/app', '/home/app/r/x/y'])
        await refused(task, { type: 'write_file', path, content: 'x' });
      await rootFilesUntouched();
    }));

  it('refuses paths through /proc magic links', () =>
    attack('users', 'paths through /proc/self/root and /proc/1/root', async () => {
      for (const path of ['/proc/self/root/root/secret', '/proc/1/root/etc/shadow']) {
        expect(await observe(task, { type: 'read_file', path }), path).toMatchObject({ type: 'error' });
      }
      expect(await observe(task, { type: 'list_dir', path: '/proc/1/root/root' })).toMatchObject({
        type: 'error',
      });
      const written = await observe(task, {
        type: 'write_file',
        path: '/proc/self/root/etc/passwd',
        content: 'x',
      });
      expect(written).toMatchObject({ type: 'error' });
      await rootFilesUntouched();
    }));

  it("reads procfs and sysfs with the user's rights, not root's", () =>
    attack('users', 'file calls into root-only /proc and /sys entries', async () => {
      // procfs and sysfs check credentials and capabilities, not only modes: what root may read
      // there (pid 1 is the agent itself), the user may not, through any file call
      const rootOnly = (
        await asRoot(
          'for f in $(find /proc/sys /sys -xdev -type f -perm -0400 ! -perm -0004 2>/dev/null | head -n 400); do ' +
            'cat "$f" >/dev/null 2>&1 && echo "$f"; done | head -n 6',
        )
      )
        .split('\n')
        .filter(Boolean);
      expect(rootOnly.length).toBeGreaterThan(0);
      for (const path of [
        '/proc/1/environ',
        '/proc/1/maps',
        '/proc/1/auxv',
        '/proc/1/syscall',
        ...rootOnly,
      ]) {
        const observation = await observe(task, { type: 'read_file', path });
        expect(observation, path).toMatchObject({ type: 'error' });
        await expectCode(sandbox.readFile(path, { user: 'app' }), 'permission_denied');
      }
      for (const path of ['/proc/1/fd', '/proc/1/map_files']) {
        expect(await observe(task, { type: 'list_dir', path }), path).toMatchObject({ type: 'error' });
      }
      // the same files of a process of the user's own are the user's to read
      const own = await shell(task, 'MARK=own-process sleep 600 >/dev/null 2>&1 & echo $!');
      const pid = own.stdout.trim();
      expect(await observe(task, { type: 'read_file', path: `/proc/${pid}/environ` })).toMatchObject({
        type: 'file',
        content: expect.stringContaining('MARK=own-process') as unknown,
      });
      expect(await observe(task, { type: 'list_dir', path: `/proc/${pid}/fd` })).toMatchObject({
        type: 'dir',
      });
      const status = await observe(task, { type: 'read_file', path: '/proc/self/status' });
      expect(status).toMatchObject({ type: 'file' });
      expect((status as { content: string }).content).toMatch(/^Uid:\s+\d+\s+1000\s+\d+\s+1000$/m);
      expect((status as { content: string }).content).toMatch(/^CapEff:\s+0+$/m);
      await shell(task, `kill ${pid}`);
    }));

  it('answers a listing too large for one reply with some of it, never a crash', () =>
    attack('users', 'list_dir of a folder whose listing is over the frame limit', async () => {
      // room for 330,000 names of 250 bytes: a whole listing would be over the agent's 80 MiB frame
      await using gym = SandboxEnv.create(env.platform, {
        sandbox: { environment, resources: { memoryMib: 2048 } },
        user: 'app',
      });
      await gym.reset();
      const long = 'n'.repeat(244);
      const made = await shell(
        gym,
        `mkdir /tmp/wide && cd /tmp/wide && seq 100001 430000 | sed 's/^/${long}/' | xargs touch && ls | wc -l`,
      );
      expect(made.stdout.trim()).toBe('330000');
      const listed = await observe(gym, { type: 'list_dir', path: '/tmp/wide' });
      expect(listed).toMatchObject({ type: 'dir', truncated: true });
      const entries = (listed as { entries: unknown[] }).entries;
      expect(entries.length).toBeGreaterThan(0);
      expect(entries.length).toBeLessThan(330000);
      const listing = await gym.current!.listDir('/tmp/wide', { user: 'app' });
      expect(listing.truncated).toBe(true);
      // the episode goes on
      expect((await shell(gym, 'id -u')).stdout).toBe('1000\n');
      const small = await observe(gym, { type: 'list_dir', path: '/srv' });
      expect(small).toMatchObject({ type: 'dir' });
      expect(small).not.toHaveProperty('truncated');
    }));

  it('never has the grader read a reward file the code under test pointed it at', () =>
    attack('users', 'replacing /logs/verifier (or the reward file) with a symlink', async () => {
      // tests that run as app, in an image that gave app /logs, next to a root-only reward file
      const dir = join(env.dataDir, 'verifier-user-task');
      await cp(TASK, dir, { recursive: true });
      const toml = await readFile(join(dir, 'task.toml'), 'utf8');
      await writeFile(join(dir, 'task.toml'), toml.replace('[verifier]\n', '[verifier]\nuser = "app"\n'));
      await writeFile(
        join(dir, 'environment', 'Dockerfile'),
        `${await readFile(join(TASK, 'environment', 'Dockerfile'), 'utf8')}` +
          'RUN mkdir -p /logs/verifier && chown app /logs && echo 1 > /srv/vault/reward.txt && echo 1 > /root/reward.txt\n',
      );
      // the tests run whatever the code under test left in its workdir first
      await writeFile(
        join(dir, 'tests', 'test.sh'),
        `#!/bin/sh\n[ -f /srv/work/hook.sh ] && sh /srv/work/hook.sh\n${await readFile(join(TASK, 'tests', 'test.sh'), 'utf8')}`,
      );
      const loaded = await loadHarborTask(dir);
      for (const hook of [
        'rm -rf /logs/verifier; ln -s /srv/vault /logs/verifier',
        'rm -rf /logs/verifier; ln -s /root /logs/verifier',
        'mkdir -p /tmp/v && ln -s /root/reward.txt /tmp/v/reward.txt && rm -rf /logs/verifier && mv /tmp/v /logs/verifier',
        'rm -f /logs/verifier/reward.txt; ln -s /srv/vault/reward.txt /logs/verifier/reward.txt',
      ]) {
        await using cheat = TaskEnv.create(env.platform, loaded);
        await cheat.reset();
        await observe(cheat, { type: 'write_file', path: '/srv/work/hook.sh', content: `${hook}; exit 0\n` });
        const graded = await cheat.step({ type: 'submit' });
        expect(graded.reward, hook).toBe(0);
      }
      // the honest twin: the same tests, run as app, score the real work
      await using honest = TaskEnv.create(env.platform, loaded);
      await honest.reset();
      await observe(honest, { type: 'write_file', path: '/srv/work/out.txt', content: 'done\n' });
      expect((await honest.step({ type: 'submit' })).reward).toBe(1);
    }));

  it("never re-runs the task's setup over the agent's files when a checkpoint is restored", () =>
    attack(
      'users',
      "restoring a disk checkpoint re-running setup as root through the agent's symlinks",
      async () => {
        // setup as root writes a state file and gives it to the agent
        const loaded = {
          ...(await loadHarborTask(TASK)),
          setupScript:
            'echo ready > /srv/work/state && chown app /srv/work/state && chmod 600 /srv/work/state',
        };
        await using episode = TaskEnv.create(env.platform, loaded);
        await episode.reset();
        const first = episode.sandbox!;
        const shadow = (await first.exec(['cat', '/etc/shadow'])).stdout;
        // the agent swaps the state file for links to root's files
        const planted = await shell(
          episode,
          'rm /srv/work/state && ln -s /etc/shadow /srv/work/state && echo mine > /home/app/note',
        );
        expect(planted.exitCode, planted.stderr).toBe(0);
        await episode.restore(await episode.checkpoint({ depth: 'disk' }));
        const restored = episode.sandbox!;
        expect(restored.id).not.toBe(first.id);
        const seen = await restored.exec([
          'sh',
          '-c',
          'cat /etc/shadow; stat -c %u:%a /etc/shadow; readlink /srv/work/state; cat /home/app/note; stat -c %U /logs/agent',
        ]);
        expect(seen.stdout).toBe(`${shadow}0:600\n/etc/shadow\nmine\napp\n`);
        await refused(episode, { type: 'read_file', path: '/srv/work/state' });
        expect((await shell(episode, 'id -u')).stdout).toBe('1000\n');
        // the honest twin: a setup that can run only once, and an episode restored from its checkpoint
        await using once = TaskEnv.create(env.platform, { ...loaded, setupScript: 'mkdir /srv/once' });
        await once.reset();
        await observe(once, { type: 'write_file', path: '/srv/work/out.txt', content: 'done\n' });
        await once.restore(await once.checkpoint({ depth: 'disk' }));
        expect(await observe(once, { type: 'list_dir', path: '/srv/once' })).toMatchObject({ type: 'dir' });
        expect((await once.step({ type: 'submit' })).reward).toBe(1);
      },
    ));

  it('makes every file the agent writes its own, setuid bits included', () =>
    attack('users', 'setuid modes and root-owned files through write_file', async () => {
      await observe(task, { type: 'write_file', path: '/home/app/made', content: 'x' });
      expect(await asRoot('stat -c %u:%g /home/app/made')).toBe('1000:1000\n');
      // the client's write_file (the wire's, the Python client's) with a setuid mode, as the user
      await sandbox.writeFile('/srv/work/tool', '#!/bin/sh\nid -u\n', { user: 'app', mode: 0o4755 });
      expect(await asRoot('stat -c %u:%a /srv/work/tool')).toBe('1000:4755\n');
      await expectCode(
        sandbox.writeFile('/usr/local/bin/tool', 'x', { user: 'app', mode: 0o4755 }),
        'permission_denied',
      );
      await expectCode(sandbox.readFile('/root/secret', { user: 'app' }), 'permission_denied');
      await expectCode(sandbox.listDir('/root', { user: 'app' }), 'permission_denied');
      expect(await asRoot('find / -xdev -user 0 -perm -4000 2>/dev/null')).toBe('');
    }));

  it('replaces only what POSIX lets the user replace', () =>
    attack('users', 'replacing root files by temp file and rename', async () => {
      // sticky /tmp: a root file there is root's; a world-writable root file in a root folder
      // cannot be replaced either (write_file renames a temp file over it)
      await refused(task, { type: 'write_file', path: '/tmp/root-file', content: 'x' });
      await refused(task, { type: 'write_file', path: '/etc/motd', content: 'x' });
      expect(await asRoot('cat /tmp/root-file /etc/motd')).toBe('root-made\nwelcome\n');
      // a folder anyone may write: the root file is replaced, by a file of the user's
      await observe(task, { type: 'write_file', path: '/srv/drop/root-file', content: 'mine' });
      expect(await asRoot('stat -c %u /srv/drop/root-file; cat /srv/drop/root-file')).toBe('1000\nmine');
      await rootFilesUntouched();
    }));

  it('runs numeric users and users missing from /etc/passwd as exactly that uid', () =>
    attack('users', 'numeric users, and users with no /etc/passwd entry', async () => {
      const cases = [
        // a uid with an entry gets its name's groups; naming the group leaves them out, as Docker does
        { user: '1000', id: '1000 1000 1000 1500' },
        { user: '1000:1000', id: '1000 1000 1000' },
        { user: 'app:crew', id: '1000 1500 1500' },
        { user: '4242', id: '4242 4242 4242' },
      ];
      for (const { user, id } of cases) {
        await using gym = SandboxEnv.create(env.platform, { sandbox: { environment }, user });
        await gym.reset();
        const ids = await shell(gym, 'echo $(id -u) $(id -g) $(id -G)');
        expect(ids.stdout, user).toBe(`${id}\n`);
        for (const path of ['/root/secret', '/etc/shadow', '/home/app/private'].slice(
          0,
          user === '4242' ? 3 : 2,
        ))
          await refused(gym, { type: 'read_file', path });
        await refused(gym, { type: 'write_file', path: '/etc/passwd', content: 'x' });
        await refused(gym, { type: 'list_dir', path: '/root' });
      }
      await using ghost = SandboxEnv.create(env.platform, { sandbox: { environment }, user: 'ghost' });
      await ghost.reset();
      for (const action of [
        { type: 'read_file', path: '/etc/hosts' },
        { type: 'exec', command: 'id' },
      ] as const) {
        const observation = await observe(ghost, action);
        expect(observation).toMatchObject({ type: 'error', code: 'invalid_argument' });
        expect((observation as { message: string }).message).toMatch(/ghost.*\/etc\/passwd/);
      }
    }));

  it('gives the agent no group it was not given', () =>
    attack('users', 'joining wheel by editing /etc/group', async () => {
      await refused(task, {
        type: 'write_file',
        path: '/etc/group',
        content: `${groupBefore}wheel:x:10:app\n`,
      });
      const appended = await shell(task, "echo 'wheel:x:10:app' >> /etc/group");
      expect(appended.exitCode).not.toBe(0);
      expect((await shell(task, 'id -G')).stdout).toBe('1000 1500\n');
      await refused(task, { type: 'read_file', path: '/srv/wheel/notes' });
      expect((await shell(task, 'cat /srv/wheel/notes')).exitCode).not.toBe(0);
      await rootFilesUntouched();
    }));

  it('runs shell sessions as the user, with its groups', () =>
    attack('users', 'shell sessions', async () => {
      const first = await shell(task, 'cd /srv/crew && export MARK=1', 'main');
      expect(first.exitCode, first.stderr).toBe(0);
      const next = await shell(task, 'echo $(id -u) $(id -G) $MARK $(pwd); cat /root/secret', 'main');
      expect(next.stdout).toBe('1000 1000 1500 1 /srv/crew\n');
      expect(next.exitCode).not.toBe(0);
    }));

  it('holds the same line in FnCall sandboxes', () =>
    attack('users', 'FnCall with a user', async () => {
      await using gym = SandboxEnv.create(env.platform, {
        sandbox: { environment, backend: 'fncall' },
        user: 'app',
      });
      await gym.reset();
      await refused(gym, { type: 'read_file', path: '/root/secret' });
      await refused(gym, { type: 'list_dir', path: '/root' });
      await refused(gym, { type: 'write_file', path: '/etc/passwd', content: 'app::0:0::/:/bin/sh\n' });
      await refused(gym, { type: 'write_file', path: '/etc/sudoers.d/app', content: 'app ALL=(ALL) ALL\n' });
      // refused writes are not kept for later calls; the user's own are, and are its own
      await observe(gym, { type: 'write_file', path: '/home/app/kept.txt', content: 'kept' });
      const seen = await shell(
        gym,
        'echo $(id -u) $(id -G); cat /etc/passwd | grep -c ^app:; stat -c %u /home/app/kept.txt',
      );
      expect(seen.stdout).toBe('1000 1000 1500\n1\n1000\n');
      expect(await observe(gym, { type: 'read_file', path: '/srv/crew/notes.txt' })).toMatchObject({
        type: 'file',
        content: 'crew-notes\n',
      });
    }));

  it("runs as the image's USER when the task names no user", () =>
    attack('users', "the image's USER", async () => {
      const dir = join(env.dataDir, 'image-user-task');
      await cp(TASK, dir, { recursive: true });
      const toml = await readFile(join(dir, 'task.toml'), 'utf8');
      await writeFile(join(dir, 'task.toml'), toml.replace('user = "app"\n', ''));
      await writeFile(
        join(dir, 'environment', 'Dockerfile'),
        `${await readFile(join(TASK, 'environment', 'Dockerfile'), 'utf8')}USER app\n`,
      );
      await using imageUser = TaskEnv.create(env.platform, await loadHarborTask(dir));
      await imageUser.reset();
      await refused(imageUser, { type: 'read_file', path: '/root/secret' });
      await refused(imageUser, { type: 'write_file', path: '/etc/passwd', content: 'x' });
      expect((await shell(imageUser, 'id -u')).stdout).toBe('1000\n');
      // a plain SandboxEnv of that environment acts as its USER too, unless told otherwise
      const userEnvironment = imageUser.sandbox!.labels['environment']!;
      await using plain = SandboxEnv.create(env.platform, { sandbox: { environment: userEnvironment } });
      await plain.reset();
      await refused(plain, { type: 'read_file', path: '/root/secret' });
      expect((await shell(plain, 'id -u')).stdout).toBe('1000\n');
    }));

  it('holds in an episode another env takes over', () =>
    attack('users', 'a resumed episode (TaskEnv.attach)', async () => {
      const loaded = await loadHarborTask(TASK);
      await using first = TaskEnv.create(env.platform, loaded);
      await first.reset();
      // an eval that was killed, resumed by a new env over the sandbox it left
      await using resumed = TaskEnv.create(env.platform, loaded);
      await resumed.attach(first.sandbox!, 'resumed-episode', 60_000);
      await refused(resumed, { type: 'read_file', path: '/root/secret' });
      await refused(resumed, { type: 'write_file', path: '/etc/passwd', content: 'x' });
      expect((await shell(resumed, 'id -u')).stdout).toBe('1000\n');
    }));

  it("acts as the task's user when attached to its sandbox without a user", () =>
    attack('users', 'attaching to a task sandbox without naming a user (sandgym mcp --sandbox)', async () => {
      // what `sandgym mcp --sandbox ID` does without --user
      await using attached = await SandboxEnv.attach(env.platform, sandbox, 'attached-without-user', {});
      expect((await shell(attached, 'id -u')).stdout).toBe('1000\n');
      await refused(attached, { type: 'read_file', path: '/root/secret' });
      await refused(attached, { type: 'write_file', path: '/etc/passwd', content: 'x' });
      await rootFilesUntouched();
      // a user named on purpose is still the one used
      await using named = await SandboxEnv.attach(env.platform, sandbox, 'attached-as-root', {
        user: 'root',
      });
      expect((await shell(named, 'id -u')).stdout).toBe('0\n');
    }));

  it("keeps each user's shell sessions apart: no code or link of the agent's in root's", () =>
    attack('users', "a planted session state for root's session of the same name", async () => {
      await using agent = await SandboxEnv.attach(env.platform, sandbox, 'sessions-agent', {});
      await using operator = await SandboxEnv.attach(env.platform, sandbox, 'sessions-operator', {
        user: 'root',
      });
      // the agent plants state where a session named "ops" could keep it, for every user it can guess
      const plant = await shell(
        agent,
        'for d in /tmp/.sandgym-sessions/ops /tmp/.sandgym-sessions-0/ops; do mkdir -p $d && ' +
          'echo "id -u > /tmp/ran-as; cat /root/secret > /tmp/leaked" > $d/env && ln -sf /etc/group $d/cwd; done; ' +
          'ln -sfn /etc /tmp/.sandgym-sessions-0/link 2>/dev/null; echo planted',
      );
      expect(plant.stdout).toBe('planted\n');
      const work = await shell(operator, 'export OPERATOR_TOKEN=s3cr3t; cd /srv && echo work', 'ops');
      expect(work.stdout).toBe('');
      expect(work.exitCode).not.toBe(0);
      expect(work.stderr).toMatch(/not this user's own folder/);
      expect(await asRoot('ls /tmp/ran-as /tmp/leaked 2>&1; true')).toMatch(/No such file/);
      await rootFilesUntouched();
      // the honest twin: once the planted folder is gone, root's session keeps its own state, unread
      await asRoot('rm -rf /tmp/.sandgym-sessions-0');
      await shell(operator, 'export OPERATOR_TOKEN=s3cr3t; cd /srv', 'ops');
      expect((await shell(operator, 'echo $OPERATOR_TOKEN $(pwd)', 'ops')).stdout).toBe('s3cr3t /srv\n');
      const peek = await shell(agent, 'cat /tmp/.sandgym-sessions-0/ops/env 2>&1; true');
      expect(peek.stdout).not.toContain('s3cr3t');
      // and the agent's own sessions still work as its user
      await shell(agent, 'export MINE=1', 'ops');
      expect((await shell(agent, 'echo $(id -u) $MINE', 'ops')).stdout).toBe('1000 1\n');
    }));

  it('has the fork value written only into folders root keeps', () =>
    attack('users', 'a symlinked /run/sandgym for the fork value a restore writes', async () => {
      await using gym = SandboxEnv.create(env.platform, { sandbox: { environment }, user: 'app' });
      await gym.reset();
      const box = gym.current!;
      // an image whose /run anyone may write: the user puts its own folder, or a link, there
      await box.exec(['sh', '-c', 'mkdir -p /run && chmod 1777 /run && rm -rf /run/sandgym']);
      expect((await shell(gym, 'ln -s /etc /run/sandgym && echo ok')).stdout).toBe('ok\n');
      await box.restore(await box.checkpoint());
      const seen = await box.exec([
        'sh',
        '-c',
        'ls -A /etc | grep -c -e fork -e sandgym-write; echo $SANDGYM_FORK',
      ]);
      expect(seen.stdout).toMatch(/^0\n[0-9a-f]{32}\n$/);
      // where root keeps the folder, the value is there, and the user cannot change it
      await box.exec(['sh', '-c', 'rm /run/sandgym && chmod 755 /run']);
      await box.restore(await box.checkpoint());
      const fork = (await box.readFile('/run/sandgym/fork')).toString();
      expect(fork).toMatch(/^[0-9a-f]{32}$/);
      await refused(gym, { type: 'write_file', path: '/run/sandgym/fork', content: 'forged' });
      expect((await box.readFile('/run/sandgym/fork')).toString()).toBe(fork);
    }));

  it('holds through MCP tools', () =>
    attack('users', 'MCP tools with --user', async () => {
      const client = new Client({ name: 'sandgym-test', version: '1.0.0' });
      const transport = new StdioClientTransport({
        command: 'node',
        args: [CLI, 'mcp', '--environment', environment, '--user', 'app'],
        env: { ...process.env, SANDGYM_DATA_DIR: env.dataDir, SANDGYM_STORE: STORE_DIR },
        stderr: 'pipe',
      });
      await client.connect(transport);
      try {
        const call = async (name: string, args: Record<string, unknown>) =>
          (await client.callTool({ name, arguments: args })) as {
            content: { text: string }[];
            isError?: boolean;
          };
        for (const [name, args] of [
          ['read_file', { path: '/root/secret' }],
          ['list_dir', { path: '/root' }],
          ['write_file', { path: '/etc/passwd', content: 'x' }],
        ] as const) {
          const result = await call(name, args);
          expect(result.isError, `${name} ${JSON.stringify(result)}`).toBe(true);
          expect(result.content[0]?.text).toMatch(/permission|denied/i);
        }
        expect((await call('exec', { command: 'id -u' })).content[0]?.text).toBe('1000\n[exit code 0]');
      } finally {
        await client.close();
      }
    }));

  describe('through the wire', () => {
    const dataDir = join(TEST_DATA_ROOT, `task-users-wire-${process.pid}`);
    let cluster: InProcessCluster;
    let envs: WireClient<typeof ENVS>;

    beforeAll(async () => {
      await mkdir(join(dataDir, 'tasks'), { recursive: true });
      await cp(TASK, join(dataDir, 'tasks', 'agent-user'), { recursive: true });
      cluster = await startInProcessCluster({
        dataDir,
        storeDir: STORE_DIR,
        nodeId: 'users',
        grants: {},
        envs: { taskRoot: join(dataDir, 'tasks') },
      });
      envs = new WireClient(`127.0.0.1:${cluster.node.port}`, ENVS, {
        token: IN_PROCESS_NODE_TOKEN,
        metadata: { 'sandgym-project': 'users' },
      });
    });

    afterAll(async () => {
      envs?.close();
      await cluster?.close();
      await rm(dataDir, { recursive: true, force: true });
    });

    it('holds in a served task env (what the Python client steps)', () =>
      attack('users', 'a served task env', async () => {
        const { envId } = await envs.call('Make', { spec: { kind: 'task', path: 'agent-user' } });
        try {
          await envs.call('Reset', { envId });
          const step = async (stepIndex: number, action: SandboxAction) =>
            (await envs.call('Step', { envId, stepIndex, action })).observation;
          expect(await step(0, { type: 'read_file', path: '/root/secret' })).toMatchObject({
            type: 'error',
            code: 'permission_denied',
          });
          expect(await step(1, { type: 'write_file', path: '/etc/passwd', content: 'x' })).toMatchObject({
            type: 'error',
            code: 'permission_denied',
          });
          expect(await step(2, { type: 'exec', command: 'id -G' })).toMatchObject({ stdout: '1000 1500\n' });
        } finally {
          await envs.call('Close', { envId });
        }
      }));

    it("holds for the wire's file calls with a user (the Python client's handle)", () =>
      attack('users', 'file calls with a user over the wire', async () => {
        await using remote = await Platform.connect(`grpc://127.0.0.1:${cluster.node.port}`, {
          token: IN_PROCESS_NODE_TOKEN,
        });
        const far = await remote.createSandbox({ environment });
        try {
          await expectCode(far.readFile('/root/secret', { user: 'app' }), 'permission_denied');
          await expectCode(far.writeFile('/etc/passwd', 'x', { user: 'app' }), 'permission_denied');
          await expectCode(far.listDir('/root', { user: 'app' }), 'permission_denied');
          await far.writeFile('/home/app/wire.txt', 'x', { user: 'app', mode: 0o4755 });
          const owner = await far.exec(['stat', '-c', '%u:%a', '/home/app/wire.txt']);
          expect(owner.stdout).toBe('1000:4755\n');
          expect((await far.exec(['id', '-G'], { user: 'app' })).stdout).toBe('1000 1500\n');
        } finally {
          await far.close();
        }
      }));
  });
});

/** The user doing its legitimate work: its own files, world-readable ones, its group's. */
describe('task users at honest work', () => {
  let env: TestPlatform;
  let task: TaskEnv;

  beforeAll(async () => {
    env = await createTestPlatform('honest-task-users');
    task = TaskEnv.create(env.platform, await loadHarborTask(TASK));
    await task.reset();
  });

  afterAll(async () => {
    await task?.close();
    await env?.[Symbol.asyncDispose]();
  });

  async function observe(action: SandboxAction): Promise<Observed> {
    const { observation, outcome } = await task.step(action);
    expect(outcome).toEqual({ kind: 'ok' });
    return observation;
  }

  it('writes, reads and lists its own files in its home and WORKDIR', async () => {
    await observe({ type: 'write_file', path: '/home/app/notes/deep/a.txt', content: 'a' });
    await observe({ type: 'write_file', path: '/srv/work/out.txt', content: 'done\n' });
    expect(await observe({ type: 'read_file', path: '/home/app/notes/deep/a.txt' })).toMatchObject({
      content: 'a',
    });
    expect(await observe({ type: 'read_file', path: '/home/app/private' })).toMatchObject({
      content: 'app-private\n',
    });
    const listed = await observe({ type: 'list_dir', path: '/home/app' });
    expect(listed.type === 'dir' && listed.entries.map((e) => e.name)).toEqual(['notes', 'private']);
    const seen = await observe({
      type: 'exec',
      command: 'pwd; cat out.txt; stat -c %U:%G /home/app/notes /home/app/notes/deep/a.txt out.txt',
    });
    expect(seen).toMatchObject({
      exitCode: 0,
      stdout: '/srv/work\ndone\napp:app\napp:app\napp:app\n',
    });
    const graded = await task.step({ type: 'submit' });
    expect(graded.reward).toBe(1);
    await task.reset();
  });

  it('reads world-readable files', async () => {
    expect(await observe({ type: 'read_file', path: '/etc/passwd' })).toMatchObject({
      content: expect.stringContaining('app:x:1000:1000') as unknown,
    });
    expect(await observe({ type: 'list_dir', path: '/etc' })).toMatchObject({ type: 'dir' });
  });

  it('reads and writes its group-owned files through its supplementary group', async () => {
    expect(await observe({ type: 'read_file', path: '/srv/crew/notes.txt' })).toMatchObject({
      content: 'crew-notes\n',
    });
    expect(await observe({ type: 'exec', command: 'cat /srv/crew/notes.txt' })).toMatchObject({
      exitCode: 0,
      stdout: 'crew-notes\n',
    });
    await observe({ type: 'write_file', path: '/srv/crew/mine.txt', content: 'shared' });
    const listed = await observe({ type: 'list_dir', path: '/srv/crew' });
    expect(listed.type === 'dir' && listed.entries.map((e) => e.name)).toEqual(['mine.txt', 'notes.txt']);
  });
});
