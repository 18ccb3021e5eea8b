import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { SandgymError, type Logger } from '../../common/index.ts';
import { detectCgroupLayout, type CgroupLayout } from './cgroups.ts';
import { runProgram } from './run-program.ts';
import { detectCriu, type CriuSupport } from './criu.ts';
import { prepareDataFolder } from './data-folder.ts';
import { setLinkProtections } from './link-protections.ts';
import { agentBinaryTarget, agentSourceDir, defaultDataDir, isInstalledPackage } from './paths.ts';

/** Host programs the backends and base layers use, and the Debian package of each. */
const REQUIRED_PROGRAMS: Record<string, string> = {
  crun: 'crun',
  'mkfs.erofs': 'erofs-utils',
  // the scratch volume: sandboxes' writable layers with a disk cap each
  'mkfs.btrfs': 'btrfs-progs',
  btrfs: 'btrfs-progs',
  // network policy for sandboxes that may reach anything beyond loopback
  nft: 'nftables',
  // flows of a sandbox's address forgotten when its rules narrow or the address is freed
  conntrack: 'conntrack',
  // the microvm backend: QEMU, the writable disk's filesystem, the guest kernel's unpacking
  'qemu-system-x86_64': 'qemu-system-x86',
  // only a Recommends of qemu-system-x86, which --no-install-recommends leaves out
  'qemu-img': 'qemu-utils',
  'mkfs.ext4': 'e2fsprogs',
  xz: 'xz-utils',
  'dpkg-deb': 'dpkg',
  debootstrap: 'debootstrap',
  busybox: 'busybox-static',
  ip: 'iproute2',
  // a recycled container's sockets ended before its next tenant (see ContainerEgress.recycle)
  ss: 'iproute2',
  nsenter: 'util-linux',
  unshare: 'util-linux',
  setfattr: 'attr',
  tar: 'tar',
  git: 'git',
  // FROM images pulled from OCI registries
  skopeo: 'skopeo',
  // zstd-compressed layers of such images
  zstd: 'zstd',
  // a swap file for hibernation (sandgym setup --swap-mib)
  mkswap: 'util-linux',
  swapon: 'mount',
  swapoff: 'mount',
  dd: 'coreutils',
  // the static in-sandbox agent, compiled on this host (see ensureAgentBinary)
  cc: 'gcc',
  make: 'make',
  '/usr/lib/x86_64-linux-gnu/libc.a': 'libc6-dev',
  // the development CA of `sandgym certs`
  openssl: 'openssl',
};

/**
 * What only the test suite needs: a real OCI registry on loopback for image pulls, Debian's
 * Python with the gRPC and msgpack modules the Python client imports (its tests and benchmark)
 * and with venv support (the golden tests' harnesses) and setuptools (the package's offline install), and the cluster's engines: an etcd cluster and a Prometheus the tests start on loopback.
 */
export const TEST_PROGRAMS: Record<string, string> = {
  'docker-registry': 'docker-registry',
  etcd: 'etcd-server',
  prometheus: 'prometheus',
  '/usr/lib/python3/dist-packages/grpc/__init__.py': 'python3-grpcio',
  '/usr/lib/python3/dist-packages/msgpack/__init__.py': 'python3-msgpack',
  // Debian 12's venv support, for the golden tests' venv of published harnesses where the
  // machine has no newer Python (scripts/harness-venv.sh)
  '/usr/lib/python3.11/ensurepip/__init__.py': 'python3-venv',
  // the build backend of `pip install ./python` offline (test/system/python-client.test.ts)
  '/usr/lib/python3/dist-packages/setuptools/__init__.py': 'python3-setuptools',
};

/** What only the benchmarks need: baselines (crun's peers Docker and Podman too), the shaped network store of `layers`, and etcd. */
export const BENCHMARK_PROGRAMS: Record<string, string> = {
  // the control-plane benchmark's etcd
  etcd: 'etcd-server',
  // the peers benchmark's Docker and Podman (started by it with no iptables rules and no bridge)
  '/usr/sbin/dockerd': 'docker.io',
  '/usr/bin/podman': 'podman',
  hyperfine: 'hyperfine',
  sshfs: 'sshfs',
  sshd: 'openssh-server',
  tc: 'iproute2',
};

/** A program on the usual paths; an absolute path (a module's file) is looked for as it is. */
function hasProgram(name: string): boolean {
  if (name.startsWith('/')) return existsSync(name);
  return ['/usr/local/bin', '/usr/bin', '/bin', '/usr/sbin', '/sbin'].some((dir) =>
    existsSync(`${dir}/${name}`),
  );
}

/** Installs the Debian packages of whichever programs are missing; returns those packages. */
export async function installPrograms(programs: Record<string, string>, logger: Logger): Promise<string[]> {
  const missing = [
    ...new Set(
      Object.entries(programs)
        .filter(([p]) => !hasProgram(p))
        .map(([, pkg]) => pkg),
    ),
  ];
  if (missing.length > 0) {
    logger.info({ packages: missing }, 'installing Debian packages');
    // RUNLEVEL=1 makes invoke-rc.d leave a package's service (sshd) stopped: nothing starts by itself
    const env = { DEBIAN_FRONTEND: 'noninteractive', RUNLEVEL: '1' };
    await runProgram('apt-get', ['update', '-qq'], { timeoutMs: 10 * 60_000, env });
    await runProgram('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...missing], {
      timeoutMs: 20 * 60_000,
      env,
    });
  }
  return missing;
}

/**
 * Compiles the static agent from the package's sources where the platform looks for it (see
 * agentBinaryTarget), unless it is there already; its path. What an installed package's
 * `sandgym setup` does once per version; a checkout's `npm run build` did it already.
 */
async function ensureAgentBinary(logger: Logger): Promise<string> {
  const target = agentBinaryTarget();
  if (existsSync(target)) return target;
  // an installed package's data folder is made here first: root's alone, as every data folder
  if (isInstalledPackage() && !process.env['SANDGYM_AGENT'])
    await prepareDataFolder(defaultDataDir(), '$SANDGYM_DATA_DIR');
  logger.info({ agent: target }, 'compiling the sandbox agent');
  await runProgram('make', ['-s', '-C', agentSourceDir(), `OUT=${target}`], { timeoutMs: 10 * 60_000 });
  return target;
}

/** What {@link prepareHost} found and did. */
export interface HostReport {
  installedPackages: string[];
  cgroups: CgroupLayout['kind'];
  hybridCgroups: boolean;
  /** Process-level checkpoints (CRIU ≥ 4.1); without it, checkpoints stay disk-level. */
  criu: CriuSupport;
}

/**
 * Prepares this host for sandboxes: installs missing Debian packages with apt-get, checks the
 * kernel features (overlayfs, EROFS, namespaces, cgroups) and hardens its link protections
 * (see link-protections.ts). Idempotent.
 */
export async function prepareHost(logger: Logger): Promise<HostReport> {
  if (process.getuid?.() !== 0) {
    throw new SandgymError(
      'permission_denied',
      'sandgym setup must run as root: it installs packages and mounts filesystems',
    );
  }
  const missing = await installPrograms(REQUIRED_PROGRAMS, logger);
  await ensureAgentBinary(logger);
  for (const fs of ['overlay', 'erofs']) {
    const known = await readFile('/proc/filesystems', 'utf8');
    if (known.includes(`\t${fs}\n`)) continue;
    await runProgram('modprobe', [fs]).catch(() => undefined);
    if (!(await readFile('/proc/filesystems', 'utf8')).includes(`\t${fs}\n`)) {
      throw new SandgymError(
        'failed_precondition',
        `This kernel has no ${fs} filesystem: load its module or use a newer kernel`,
      );
    }
  }
  await setLinkProtections(logger);
  const layout = await detectCgroupLayout();
  return {
    installedPackages: missing,
    cgroups: layout.kind,
    hybridCgroups: layout.kind === 'v1' && layout.unified !== undefined,
    criu: await detectCriu(),
  };
}
