import { createHash } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { chmod, copyFile, mkdir, mkdtemp, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { SandgymError, type Logger } from '../../common/index.ts';
import { INSTALLED_CRIU, SANDGYM_CRIU_RUN_DIR, detectCriu, type CriuSupport } from './criu.ts';
import { runProgram } from './run-program.ts';

/**
 * Where CRIU's source comes from: Debian trixie's source package, whose 4.1.x works on the
 * kernels that Debian 12's CRIU 3.17 fails on. Its build dependencies are all in bookworm.
 */
const SOURCE_SUITE = 'trixie';

/** What building CRIU's binary takes, from Debian's own build dependencies of the package. */
const BUILD_PACKAGES = [
  'gcc',
  'make',
  'pkg-config',
  'libbsd-dev',
  'libcap-dev',
  'libgnutls28-dev',
  'libnet1-dev',
  'libnftables-dev',
  'libnl-3-dev',
  'libprotobuf-c-dev',
  'libprotobuf-dev',
  'protobuf-c-compiler',
  'protobuf-compiler',
  'python3-protobuf',
  'uuid-dev',
];

/**
 * Makes CRIU 4.1 or newer usable on this host (`sandgym setup`), once: unless a usable one that
 * keeps its kernel cache is there, it fetches the upstream tarball of Debian trixie's criu source package (checked
 * against the SHA-256 of apt's signed index), builds the binary and installs it as
 * /usr/local/sbin/criu, keeping its kernel cache in SANDGYM_CRIU_RUN_DIR. apt's own configuration is left as it was: the trixie source is named
 * on the command line only.
 */
export async function ensureCriu(workDir: string, mirror: string, logger: Logger): Promise<CriuSupport> {
  const found = await detectCriu();
  if (found.usable && found.kernelCacheKept) return found;
  const reason =
    found.reason ??
    'it cannot keep its kernel cache (its folder is not a tmpfs): every run would probe the kernel';
  logger.info({ reason }, `building CRIU from Debian ${SOURCE_SUITE}'s source`);
  const env = { DEBIAN_FRONTEND: 'noninteractive' };
  await runProgram('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...BUILD_PACKAGES], {
    timeoutMs: 20 * 60_000,
    env,
  });
  await mkdir(workDir, { recursive: true });
  const build = await mkdtemp(join(workDir, 'criu-'));
  try {
    const sources = join(build, 'sources.list');
    await writeFile(sources, `deb-src ${mirror} ${SOURCE_SUITE} main\n`);
    // this source alone, and no clean-up of the lists the host's own sources fetched
    const only = [
      '-o',
      `Dir::Etc::sourcelist=${sources}`,
      '-o',
      'Dir::Etc::sourceparts=-',
      '-o',
      'APT::Get::List-Cleanup=0',
    ];
    await runProgram('apt-get', [...only, 'update', '-qq'], { timeoutMs: 10 * 60_000, env });
    const uris = await runProgram('apt-get', [...only, 'source', '--print-uris', '-qq', 'criu'], {
      cwd: build,
      env,
    });
    const tarball = upstreamTarball(uris);
    logger.info({ url: tarball.url }, 'fetching the CRIU source');
    const bytes = Buffer.from(await (await fetchOk(tarball.url)).arrayBuffer());
    const digest = createHash('sha256').update(bytes).digest('hex');
    if (digest !== tarball.sha256) {
      throw new SandgymError(
        'platform_error',
        `The CRIU source ${tarball.url} has SHA-256 ${digest}, but apt's signed index says ${tarball.sha256}`,
      );
    }
    await writeFile(join(build, tarball.name), bytes);
    await runProgram('tar', ['-xf', tarball.name], { cwd: build });
    const tree = (await readdir(build, { withFileTypes: true })).find(
      (entry) => entry.isDirectory() && entry.name.startsWith('criu-'),
    );
    if (!tree) throw new SandgymError('platform_error', `${tarball.name} holds no criu-* folder`);
    const source = join(build, tree.name);
    logger.info({ source }, 'compiling CRIU (about a minute)');
    // its kernel cache in a tmpfs of sandgym's own, whatever /run is on this host
    await runProgram(
      'make',
      ['-s', `-j${availableParallelism()}`, 'criu', `RUNDIR=${SANDGYM_CRIU_RUN_DIR}`],
      {
        cwd: source,
        timeoutMs: 30 * 60_000,
      },
    );
    // installed whole or not at all: a copy beside it, then a rename
    await mkdir(join(INSTALLED_CRIU, '..'), { recursive: true });
    const staged = `${INSTALLED_CRIU}.new`;
    await copyFile(join(source, 'criu', 'criu'), staged);
    await chmod(staged, 0o755);
    await rename(staged, INSTALLED_CRIU);
  } finally {
    await rm(build, { recursive: true, force: true });
  }
  const built = await detectCriu();
  if (!built.usable) {
    throw new SandgymError(
      'failed_precondition',
      `CRIU ${built.version ?? ''} was built and installed as ${INSTALLED_CRIU}, but cannot checkpoint on this host: ${built.reason}`,
    );
  }
  logger.info({ version: built.version }, 'CRIU installed');
  return built;
}

/** The upstream tarball among `apt-get source --print-uris` lines, with its signed SHA-256. */
function upstreamTarball(printed: string): { url: string; name: string; sha256: string } {
  for (const line of printed.split('\n')) {
    const match = /^'([^']+)'\s+(\S+\.orig\.tar\.\w+)\s+\d+\s+SHA256:([0-9a-f]{64})/.exec(line.trim());
    if (match) return { url: match[1]!, name: match[2]!, sha256: match[3]! };
  }
  throw new SandgymError(
    'platform_error',
    `apt-get source named no upstream tarball for criu in Debian ${SOURCE_SUITE}: ${printed.trim().slice(0, 300)}`,
  );
}

async function fetchOk(url: string): Promise<Response> {
  const response = await fetch(url, { signal: AbortSignal.timeout(10 * 60_000) });
  if (!response.ok) throw new SandgymError('platform_error', `GET ${url} answered ${response.status}`);
  return response;
}
