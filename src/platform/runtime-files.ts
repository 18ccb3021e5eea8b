import { SandgymError } from '../common/index.ts';
import type { BackendSandbox } from '../backends/index.ts';

/**
 * Files a container runtime writes into every container at its start and that never belong to
 * its image: Docker bind-mounts them, so `docker commit` and image builds never hold them. A
 * sandbox's writes to them (an ENTRYPOINT appending a hosts line, the agent's edits) stay in
 * that sandbox: packDiff leaves them out of every layer it makes (a grader's diff, a checkpoint),
 * and each new sandbox gets its own written anew.
 */
export const RUNTIME_FILES: readonly string[] = ['etc/hosts', 'etc/hostname', 'etc/resolv.conf'];

/** Every sandbox's hostname, as the container's UTS namespace and the VM image set it. */
const SANDBOX_HOSTNAME = 'sandbox';

/**
 * A host name that may go in /etc/hosts: letters, digits, `-`, `_` and dots between labels, at
 * most 253 characters, each label at most 63 (RFC 1123, plus `_` as compose allows it). Nothing
 * else: a name comes from a task author (a compose service), and a newline or a space in it would
 * add hosts lines of theirs (pointing a package index or the grader's names elsewhere).
 */
const HOST_NAME =
  /^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*$/;

/** `name` when it is a valid host name; else an `invalid_argument` saying what `what` must be. */
export function checkHostName(name: string, what: string): string {
  if (HOST_NAME.test(name)) return name;
  throw new SandgymError(
    'invalid_argument',
    `${what} ${JSON.stringify(name.slice(0, 80))} is not a host name: use letters, digits, "-", "_" and dots, at most 63 characters between dots`,
  );
}

/** The /etc/hosts a sandbox starts with: loopback by its names, and its own hostname. */
function baseHostsFile(hostname = SANDBOX_HOSTNAME): string {
  checkHostName(hostname, 'The sandbox hostname');
  return [
    '127.0.0.1\tlocalhost',
    '::1\tlocalhost ip6-localhost ip6-loopback',
    'fe00::0\tip6-localnet',
    'ff00::0\tip6-mcastprefix',
    'ff02::1\tip6-allnodes',
    'ff02::2\tip6-allrouters',
    // where Debian puts a host's own name when it has no address of its own to give it
    `127.0.1.1\t${hostname}`,
    '',
  ].join('\n');
}

/**
 * Writes a new sandbox's /etc/hosts and /etc/hostname, over whatever its image had there, as
 * Docker does at a container's start.
 */
export async function writeRuntimeFiles(sandbox: BackendSandbox, hostname = SANDBOX_HOSTNAME): Promise<void> {
  await Promise.all([
    sandbox.writeFile('/etc/hosts', baseHostsFile(hostname), { mode: 0o644 }),
    sandbox.writeFile('/etc/hostname', `${hostname}\n`, { mode: 0o644 }),
  ]);
}
