import { spawn } from 'node:child_process';
import { constants, openSync, closeSync } from 'node:fs';
import { mkdir, readFile, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';
import { criuProgram } from '../host/criu.ts';
import { mountOverlay as mountLayerOverlay } from '../host/overlay-mount.ts';
import { runProgram } from '../host/run-program.ts';
import type { AgentChannel } from '../internal/agent-channel.ts';
import { folderBytes } from '../internal/folder-size.ts';
import { keepNetwork, openKeptNetwork, releaseKeptNetwork } from './kept-network.ts';

/**
 * A file the sandbox's agent holds that lives outside the sandbox's mount namespace: its log
 * and its channel FIFOs, in the sandbox's folder on the node. CRIU cannot reopen those by path
 * from inside, so a dump names them external and a restore hands it fresh descriptors for them.
 */
const externalFileSchema = z.object({
  /** CRIU's name for it: `file[MNT_ID:INODE]`, in hex. */
  key: z.string().regex(/^file\[[0-9a-f]+:[0-9a-f]+\]$/),
  /** Its name in the sandbox's folder. */
  name: z.enum(['runtime.log', 'agent.requests', 'agent.responses']),
});
const imageRecordSchema = z.object({
  externals: z.array(externalFileSchema),
  /** Whether its network namespace was kept out of the image, held beside it (see kept-network.ts). */
  keptNetwork: z.boolean().optional(),
});
type ExternalFile = z.infer<typeof externalFileSchema>;

/** A sandbox's processes and memory on disk (CRIU's image files), in a folder of its own. */
export interface MemoryImage {
  dir: string;
  /** Bytes its files take: roughly the memory the processes held. */
  sizeBytes: number;
}

/**
 * Options every CRIU run shares. The sandbox's bind mounts from the node are external, kept by
 * path. Its network is not locked: CRIU's lock (firewall rules it adds and removes in the
 * sandbox's network namespace, two more programs per run, 60-70 ms of a restore here) keeps
 * packets off sockets while their processes are stopped, and only a sandbox whose namespace
 * reaches nothing but itself is dumped (see `ContainerMemory.available`): no packet can arrive.
 */
const SHARED = [
  '--ext-mount-map',
  'auto',
  '--enable-external-sharing',
  '--enable-external-masters',
  '--network-lock',
  'skip',
];

/** How long a dump or restore may take; they are I/O of the sandbox's memory size. */
const CRIU_TIMEOUT_MS = 120_000;

/**
 * Dumps the process tree of a container (rooted at `initPid`, its agent) into `imageDir`. The
 * processes carry on, stay stopped (SIGSTOP: the caller copies their files at that instant and
 * continues them), or are gone when it returns (hibernation: all of their memory, kernel memory
 * included, is the host's again). CRIU stops the processes itself, so the cgroup must not be
 * frozen.
 */
export async function dumpTree(
  initPid: number,
  sandboxDir: string,
  imageDir: string,
  /** `running`: a checkpoint; `stopped`: a checkpoint whose caller copies files, then continues them; `gone`: hibernation. */
  options: { afterwards: 'running' | 'stopped' | 'gone' },
): Promise<MemoryImage> {
  // the sandbox's whole memory: root's alone, whatever the folders above allow
  await mkdir(imageDir, { recursive: true, mode: 0o700 });
  try {
    const externals = await externalFilesOf(initPid, sandboxDir);
    // a hibernation keeps the namespace; a checkpoint's restores each need a network of their own
    const keptNetwork = options.afterwards === 'gone';
    const networkArgs = keptNetwork ? await keepNetwork(initPid, imageDir) : [];
    const args = [
      'dump',
      '--tree',
      String(initPid),
      '--images-dir',
      imageDir,
      '--log-file',
      'dump.log',
      ...SHARED,
      ...externals.flatMap((file) => ['--external', file.key]),
      ...networkArgs,
      ...(options.afterwards === 'running' ? ['--leave-running'] : []),
      ...(options.afterwards === 'stopped' ? ['--leave-stopped'] : []),
    ];
    await runProgram(criuProgram(), args, { timeoutMs: CRIU_TIMEOUT_MS }).catch(async (error: unknown) => {
      const log = await tailOf(join(imageDir, 'dump.log'));
      throw new SandgymError('platform_error', `CRIU could not checkpoint the sandbox: ${log}`, {
        cause: error,
      });
    });
    await writeFile(join(imageDir, 'sandgym.json'), JSON.stringify({ externals, keptNetwork }));
    return { dir: imageDir, sizeBytes: await folderBytes(imageDir) };
  } catch (error) {
    // nothing half made stays: neither the folder nor a namespace it holds
    await releaseKeptNetwork(imageDir);
    await rm(imageDir, { recursive: true, force: true });
    throw error;
  }
}

/**
 * Starts the processes of the image in `imageDir` again, in new namespaces, rooted at `rootfs`
 * (an overlay the caller mounted) and in the cgroups they were dumped from (or under
 * `cgroupRoot`). Their log and channel are the files
 * of the same names in `sandboxDir`. `openChannel` opens the caller's ends of the channel while
 * the FIFOs are held open here: the agent exits when its request FIFO has no writer, so one
 * must be there before the agent runs. Returns what it opened; the restored processes run
 * detached, with no parent here.
 */
export async function restoreTree(
  imageDir: string,
  sandboxDir: string,
  rootfs: string,
  openChannel: () => AgentChannel,
  /** Restore into these cgroups (`/sandgym/…/<id>` in every hierarchy) instead of the dumped ones: a fork. */
  cgroupRoot?: string,
): Promise<AgentChannel> {
  const record = parseAt(
    imageRecordSchema,
    JSON.parse(await readFile(join(imageDir, 'sandgym.json'), 'utf8')),
    `memory image ${imageDir}`,
  );
  // FIFOs opened for reading and writing never block on a missing peer
  const fds = record.externals.map((file) =>
    openSync(
      join(sandboxDir, file.name),
      file.name === 'runtime.log' ? constants.O_WRONLY | constants.O_APPEND : constants.O_RDWR,
    ),
  );
  let channel: AgentChannel | undefined;
  try {
    const network = record.keptNetwork ? await openKeptNetwork(imageDir, 3 + fds.length) : undefined;
    if (network) fds.push(network.fd);
    channel = openChannel();
    const args = [
      'restore',
      '--images-dir',
      imageDir,
      '--log-file',
      'restore.log',
      '--root',
      rootfs,
      '--restore-detached',
      ...SHARED,
      // the child gets the descriptors in order from fd 3
      ...record.externals.flatMap((file, i) => ['--inherit-fd', `fd[${3 + i}]:${file.key}`]),
      ...(network?.args ?? []),
      ...(cgroupRoot ? ['--cgroup-root', cgroupRoot] : []),
    ];
    const code = await new Promise<number | null>((resolve, reject) => {
      const child = spawn(criuProgram(), args, { stdio: ['ignore', 'ignore', 'ignore', ...fds] });
      const timer = setTimeout(() => child.kill('SIGKILL'), CRIU_TIMEOUT_MS);
      child.once('error', reject);
      child.once('exit', (exitCode) => {
        clearTimeout(timer);
        resolve(exitCode);
      });
    });
    if (code !== 0) {
      throw new SandgymError(
        'platform_error',
        `CRIU could not restore the sandbox (exit ${code}): ${await tailOf(join(imageDir, 'restore.log'))}`,
      );
    }
    return channel;
  } catch (error) {
    channel?.fail(new SandgymError('platform_error', 'The restore failed'));
    throw error;
  } finally {
    for (const fd of fds) closeSync(fd);
  }
}

/** The image in `dir`, as an earlier dump left it. */
export async function memoryImageAt(dir: string): Promise<MemoryImage> {
  return { dir, sizeBytes: await folderBytes(dir) };
}

/** The container's first process (its agent) among the pids of its cgroup: pid 1 of its pid namespace. */
export async function containerInitOf(pids: readonly number[]): Promise<number> {
  for (const pid of pids) {
    const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
    if (/^NSpid:.*\s1$/m.test(status)) return pid;
  }
  throw new SandgymError('failed_precondition', 'The container has no first process left to checkpoint');
}

/**
 * Fails `unsupported`, naming the cause and the fix, where CRIU would fail to dump `pids` (a
 * container's processes) on this host. CRIU reads every process's resource limits (prlimit),
 * which the kernel allows a caller only for processes whose real, effective and saved user and
 * group ids all equal its own, or with CAP_SYS_RESOURCE. Where this host withholds that
 * capability from sandgym (its bounding set, as a host that is itself a container may), a
 * process the agent left running as another user than root made every checkpoint a
 * `platform_error` with CRIU's `Can't get rlimit`; `unsupported` lets a caller fall back to a
 * disk checkpoint, which needs no CRIU.
 */
export async function assertCriuCanDump(pids: readonly number[], hasSysResource: boolean): Promise<void> {
  if (hasSysResource) return;
  const others: string[] = [];
  for (const pid of pids) {
    const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
    const ids = ['Uid', 'Gid'].flatMap(
      (field) => new RegExp(`^${field}:\\s+(\\d+)\\s+(\\d+)\\s+(\\d+)`, 'm').exec(status)?.slice(1) ?? [],
    );
    if (ids.some((id) => id !== '0')) others.push(`${pid} (uid ${ids[0] ?? '?'})`);
  }
  if (others.length === 0) return;
  throw new SandgymError(
    'unsupported',
    `The sandbox cannot be checkpointed at memory depth: processes ${others.slice(0, 5).join(', ')} run as a user other than root, and CRIU reads their resource limits only with CAP_SYS_RESOURCE, which this host withholds from sandgym (its capability bounding set). Run sandgym with CAP_SYS_RESOURCE (e.g. a container started with --cap-add SYS_RESOURCE), or checkpoint at depth 'disk'`,
  );
}

/** Mounts a container's overlay at `target` for a restore; its lower dirs come base first. */
export async function mountOverlay(
  target: string,
  lowers: readonly string[],
  sandboxDir: string,
): Promise<void> {
  await mountLayerOverlay(target, lowers, {
    upper: join(sandboxDir, 'rw', 'upper'),
    work: join(sandboxDir, 'rw', 'work'),
  });
}

/**
 * Detaches the overlay a restore was rooted at: the restored mount namespace holds its own copy,
 * and the node must not keep one.
 */
export async function detachOverlay(target: string): Promise<void> {
  await runProgram('umount', ['--lazy', target]);
}

/**
 * The files of `initPid` that are the sandbox's own files on the node (outside the container),
 * as CRIU names them. They are told by device and inode, never by path: a tenant's file inside
 * the container can carry any name, and taking one for the agent's channel would hand the
 * tenant that channel on restore.
 */
async function externalFilesOf(initPid: number, sandboxDir: string): Promise<ExternalFile[]> {
  const ours = await Promise.all(
    externalFileSchema.shape.name.options.map(async (name) => {
      const { dev, ino } = await stat(join(sandboxDir, name));
      return { name, dev, ino };
    }),
  );
  const found = new Map<string, ExternalFile>();
  for (const fd of await readdir(`/proc/${initPid}/fd`)) {
    const held = await stat(`/proc/${initPid}/fd/${fd}`).catch(() => undefined);
    const file = held && ours.find((o) => o.dev === held.dev && o.ino === held.ino);
    if (!held || !file) continue;
    const fdinfo = await readFile(`/proc/${initPid}/fdinfo/${fd}`, 'utf8');
    const mountId = Number(/^mnt_id:\s*(\d+)/m.exec(fdinfo)?.[1]);
    const key = `file[${mountId.toString(16)}:${held.ino.toString(16)}]`;
    found.set(key, { key, name: file.name });
  }
  return [...found.values()];
}

/** The last lines of a CRIU log, for an error message. */
async function tailOf(log: string): Promise<string> {
  const text = await readFile(log, 'utf8').catch(() => '');
  const errors = text.split('\n').filter((line) => line.includes('Error'));
  return (errors.length ? errors : text.trim().split('\n')).slice(-4).join(' | ') || `see ${log}`;
}
