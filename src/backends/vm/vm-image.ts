import { existsSync } from 'node:fs';
import { copyFile, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { SandgymError, type Logger } from '../../common/index.ts';
import { buildDebianRootfs } from '../host/base-rootfs.ts';
import { sha256OfFile } from '../host/layer-verify.ts';
import { runProgram } from '../host/run-program.ts';
import { buildFolderOnce } from './build-once.ts';

/** A full-OS disk image the vm backend boots: the disk, and its own kernel and initramfs. */
export interface VmImage {
  /** qcow2; every VM gets a copy-on-write overlay of it. */
  disk: string;
  kernel: string;
  initrd: string;
}

/** What the image holds beyond Debian's minimal base: an init system, its own kernel, `ps`. */
const IMAGE_PACKAGES = ['systemd-sysv', 'udev', 'linux-image-amd64', 'initramfs-tools', 'procps'];
const IMAGE_SIZE_GIB = 4;

/** The agent as a systemd service, started when udev names the host's virtio-serial port. */
const AGENT_UNIT = `[Unit]
Description=sandgym in-sandbox agent
BindsTo=dev-virtio\\x2dports-sandgym.device
After=dev-virtio\\x2dports-sandgym.device

[Service]
ExecStart=/usr/local/sbin/sandgym-agent --vm-service
Restart=no

[Install]
WantedBy=multi-user.target
`;

const readyFile = z.object({ kernel: z.string(), initrd: z.string() });

/**
 * The vm backend's image in `dir`, built on first use: Debian bookworm by debootstrap with
 * systemd and Debian's kernel, the agent installed as a service, as an ext4 filesystem in a qcow2
 * disk. QEMU loads the image's own kernel and initramfs (copied out of its /boot) rather than a
 * bootloader. The debootstrapped tree is kept, and the disk is made again whenever the agent
 * binary changes (the image is named by the agent's digest), so an upgraded agent never talks to
 * an old one.
 */
export async function ensureVmImage(
  dir: string,
  agentPath: string,
  mirror: string,
  logger: Logger,
): Promise<VmImage> {
  const digest = (await sha256OfFile(agentPath)).replace(/^sha256:/, '').slice(0, 16);
  const imageDir = join(dir, `image-${digest}`);
  const ready = await readImage(imageDir);
  if (ready) return ready;
  await mkdir(dir, { recursive: true });
  const rootfs = await ensureRootfs(dir, mirror, logger);
  await buildFolderOnce(imageDir, 'ready.json', async (work) => {
    logger.info({ dir: imageDir }, 'making the vm image (agent installed as a service)');
    await copyFile(agentPath, join(rootfs, 'usr/local/sbin/sandgym-agent'));
    await mkdir(join(rootfs, 'etc/systemd/system/multi-user.target.wants'), { recursive: true });
    await writeFile(join(rootfs, 'etc/systemd/system/sandgym-agent.service'), AGENT_UNIT);
    await rm(join(rootfs, 'etc/systemd/system/multi-user.target.wants/sandgym-agent.service'), {
      force: true,
    });
    await runProgram('ln', [
      '-s',
      '/etc/systemd/system/sandgym-agent.service',
      join(rootfs, 'etc/systemd/system/multi-user.target.wants/sandgym-agent.service'),
    ]);
    await writeFile(join(rootfs, 'etc/fstab'), '/dev/vda / ext4 defaults 0 1\n');
    await writeFile(join(rootfs, 'etc/hostname'), 'sandbox\n');
    const boot = await readdir(join(rootfs, 'boot'));
    const kernel = boot.find((f) => f.startsWith('vmlinuz-'));
    const initrd = boot.find((f) => f.startsWith('initrd.img-'));
    if (!kernel || !initrd)
      throw new SandgymError(
        'platform_error',
        `The vm image's /boot has no kernel or initramfs: ${boot.join(', ')}`,
      );
    await copyFile(join(rootfs, 'boot', kernel), join(work, 'vmlinuz'));
    await copyFile(join(rootfs, 'boot', initrd), join(work, 'initrd.img'));
    const raw = join(work, 'disk.raw');
    await runProgram('truncate', ['-s', `${IMAGE_SIZE_GIB}G`, raw]);
    await runProgram('mkfs.ext4', ['-q', '-F', '-L', 'sandgym-root', '-d', rootfs, raw], {
      timeoutMs: 10 * 60_000,
    });
    await runProgram('qemu-img', ['convert', '-O', 'qcow2', raw, join(work, 'disk.qcow2')], {
      timeoutMs: 10 * 60_000,
    });
    await rm(raw);
    await writeFile(join(work, 'ready.json'), JSON.stringify({ kernel, initrd }));
  });
  // images for earlier agents are of no use any more
  for (const old of await readdir(dir)) {
    if (old.startsWith('image-') && !old.includes('.building-') && join(dir, old) !== imageDir)
      await rm(join(dir, old), { recursive: true, force: true });
  }
  const image = await readImage(imageDir);
  if (!image) throw new SandgymError('platform_error', `The vm image in ${imageDir} did not come out whole`);
  return image;
}

async function readImage(imageDir: string): Promise<VmImage | undefined> {
  try {
    readyFile.parse(JSON.parse(await readFile(join(imageDir, 'ready.json'), 'utf8')));
    return {
      disk: join(imageDir, 'disk.qcow2'),
      kernel: join(imageDir, 'vmlinuz'),
      initrd: join(imageDir, 'initrd.img'),
    };
  } catch {
    return undefined;
  }
}

/** The debootstrapped tree, made once (in a temp folder, then renamed). */
async function ensureRootfs(dir: string, mirror: string, logger: Logger): Promise<string> {
  const rootfs = join(dir, 'rootfs');
  if (existsSync(join(rootfs, 'etc/os-release'))) return rootfs;
  await buildFolderOnce(rootfs, 'etc/os-release', async (work) => {
    logger.info({ mirror }, 'debootstrapping the vm image (Debian bookworm with systemd and its kernel)');
    await buildDebianRootfs(work, { suite: 'bookworm', mirror, packages: IMAGE_PACKAGES });
  });
  return rootfs;
}
