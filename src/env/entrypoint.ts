import type { Environment, Sandbox } from '../platform/index.ts';
import { exposedTcpPorts, listeningPorts } from './task-services.ts';

/**
 * What Harbor's compose file runs in a task's container instead of the image's CMD: the image's
 * ENTRYPOINT stays, so a script that starts a server and ends in `exec "$@"` leaves the server
 * running and the container idle.
 */
const IDLE_COMMAND = ['sh', '-c', 'sleep infinity'];

/** How long a started entrypoint may take to listen on the ports its image exposes. */
const LISTEN_WAIT_MS = 60_000;
const LISTEN_POLL_MS = 100;

/** The command line a task's container starts with, as Harbor runs it; none without an ENTRYPOINT. */
function entrypointArgv(environment: Environment): string[] | undefined {
  const entrypoint = environment.image?.entrypoint ?? [];
  return entrypoint.length ? [...entrypoint, ...IDLE_COMMAND] : undefined;
}

/** What runs the entrypoint: the image's USER in its WORKDIR (the task's, where it names one). */
export interface EntrypointOptions {
  user: string;
  workdir: string;
}

/**
 * Starts the image's ENTRYPOINT (with the idle command as its arguments) in the background of
 * `sandbox`, as a container's start would: its own process, under the sandbox's environment
 * (the image's ENV and the task's), living until the sandbox ends. Resolves once it listens on
 * every TCP port the image EXPOSEs, or it ended, or a minute went by: Docker waits for none of
 * that, but the agent's first command and a grader's tests then never race the server's start.
 * Nothing runs without an ENTRYPOINT.
 */
export async function startEntrypoint(
  sandbox: Sandbox,
  environment: Environment,
  options: EntrypointOptions,
): Promise<boolean> {
  const argv = entrypointArgv(environment);
  if (!argv) return false;
  let ended = false;
  // long-lived: the sandbox's close ends it; how it ended is nobody's business but its own
  void sandbox
    .execStream(argv, { cwd: options.workdir, user: options.user })
    .result.catch(() => undefined)
    .finally(() => (ended = true));
  const ports = exposedTcpPorts(environment);
  const deadline = Date.now() + LISTEN_WAIT_MS;
  while (ports.length && !ended && Date.now() < deadline) {
    const listening = await listeningPorts(sandbox);
    if (ports.every((port) => listening.has(port))) break;
    await new Promise((resolve) => setTimeout(resolve, LISTEN_POLL_MS));
  }
  return true;
}
