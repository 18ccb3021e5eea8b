import { chmod, copyFile, mkdir, rm, symlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { SandgymError } from '../../common/index.ts';
import { hostProgram } from './paths.ts';
import { runProgram } from './run-program.ts';

/** The skeleton every root needs: mount points for the runtime, and a root user. */
async function writeSkeleton(dir: string): Promise<void> {
  for (const sub of ['proc', 'sys', 'dev', 'tmp', 'root', 'etc', 'bin', 'usr/bin', 'sbin', 'usr/sbin']) {
    await mkdir(join(dir, sub), { recursive: true });
  }
  await chmod(join(dir, 'tmp'), 0o1777);
  await writeFile(
    join(dir, 'etc/passwd'),
    'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n',
  );
  await writeFile(join(dir, 'etc/group'), 'root:x:0:\nnogroup:x:65534:\n');
  await writeFile(join(dir, 'etc/hosts'), '127.0.0.1 localhost sandbox\n::1 localhost\n');
}

/** A tiny root: Debian's static busybox and its applets. Builds in well under a second. */
export async function buildBusyboxRootfs(dir: string): Promise<void> {
  const busybox = hostProgram('busybox');
  const listing = await runProgram(busybox, ['--list-full']);
  await writeSkeleton(dir);
  await copyFile(busybox, join(dir, 'bin/busybox'));
  await chmod(join(dir, 'bin/busybox'), 0o755);
  for (const applet of listing.split('\n').filter(Boolean)) {
    if (applet === 'bin/busybox') continue;
    const target = join(dir, applet);
    await mkdir(dirname(target), { recursive: true });
    const depth = applet.split('/').length - 1;
    await symlink(`${'../'.repeat(depth)}bin/busybox`, target).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== 'EEXIST') throw error;
    });
  }
}

/** Options for {@link buildDebianRootfs}. */
export interface DebianRootfsOptions {
  suite: string;
  mirror: string;
  packages: string[];
}

/** A Debian minbase root made by debootstrap from the mirror, without apt's download caches. */
export async function buildDebianRootfs(dir: string, options: DebianRootfsOptions): Promise<void> {
  try {
    await runProgram(
      hostProgram('debootstrap'),
      ['--variant=minbase', `--include=${options.packages.join(',')}`, options.suite, dir, options.mirror],
      { timeoutMs: 30 * 60_000 },
    );
  } catch (error) {
    throw new SandgymError(
      'platform_error',
      `debootstrap of Debian ${options.suite} from ${options.mirror} failed; set SANDGYM_DEBIAN_MIRROR to a reachable mirror`,
      { cause: error },
    );
  }
  for (const cache of ['var/cache/apt/archives', 'var/lib/apt/lists', 'var/log']) {
    await rm(join(dir, cache), { recursive: true, force: true });
    await mkdir(join(dir, cache), { recursive: true });
  }
}
