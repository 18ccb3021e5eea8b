import { SandgymError, isSandgymError, messageOf } from '../common/index.ts';
import {
  checkHostName,
  hostPlatformOf,
  type HostPlatform,
  type Environment,
  type PlatformClient,
  type Sandbox,
  type SandboxGroupNetwork,
} from '../platform/index.ts';
import { TaskError, taskStorageStem, type Task, type TaskService } from './tasks/task.ts';

/** How long a service may take to listen on the ports its image exposes. */
const READY_TIMEOUT_MS = 60_000;
const READY_POLL_MS = 100;

/** A service up: its sandbox, its address on the group, its name there. */
interface RunningService {
  name: string;
  sandbox: Sandbox;
  address: string;
}

/** What a service runs: compose's entrypoint and command over the image's, as Docker combines them. */
function serviceArgv(service: TaskService, environment: Environment): string[] {
  const entrypoint = service.entrypoint ?? environment.image?.entrypoint ?? [];
  // a compose entrypoint drops the image's CMD, as in Docker
  const command = service.command ?? (service.entrypoint ? [] : (environment.image?.cmd ?? []));
  return [...entrypoint, ...command];
}

/** The TCP ports an image says it listens on (EXPOSE 6379, 5432/tcp). */
export function exposedTcpPorts(environment: Environment): number[] {
  return (environment.image?.exposedPorts ?? [])
    .filter((p) => !p.endsWith('/udp'))
    .map((p) => Number.parseInt(p, 10))
    .filter((p) => Number.isInteger(p) && p > 0 && p < 65536);
}

/** Ports in LISTEN state in a sandbox's network namespace, from its /proc/net/tcp{,6}. */
export async function listeningPorts(sandbox: Sandbox): Promise<Set<number>> {
  const ports = new Set<number>();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    const text = await sandbox.readFile(file).then(
      (b) => b.toString(),
      () => '',
    );
    for (const line of text.split('\n').slice(1)) {
      const [, local, , state] = line.trim().split(/\s+/);
      if (state === '0A' && local) ports.add(Number.parseInt(local.split(':')[1] ?? '', 16));
    }
  }
  return ports;
}

/**
 * A task's docker-compose services, running beside its sandboxes as one group: each service in
 * a sandbox of its own environment (its Dockerfile built, or its image from the store or a
 * registry), all on a private group network where each member finds the others by name through
 * /etc/hosts. The agent's sandbox and the graders join the same group, so tests see the state
 * the agent left in the services. Closing ends the services and the network together.
 */
export class TaskServices {
  /** Where the task's own sandboxes (the agent's, graders) sit on the group, by sandbox id. */
  private readonly joined = new Map<string, string>();

  private constructor(
    private readonly network: SandboxGroupNetwork,
    private readonly running: RunningService[],
  ) {}

  /** Builds and starts the task's services; undefined when it has none. */
  static async start(
    platform: PlatformClient,
    task: Task,
    notes: string[],
    /** The run its sandboxes join, if any. */
    inRun: { run?: string } = {},
  ): Promise<TaskServices | undefined> {
    const services = task.services ?? [];
    if (services.length === 0) return undefined;
    // the names go into /etc/hosts lines: a task built in code skips the compose loader's check
    for (const service of services) {
      try {
        checkHostName(service.name, 'Its service name');
      } catch (error) {
        throw new TaskError(task.id, messageOf(error));
      }
    }
    const host = hostPlatformOf(platform);
    if (!host)
      throw new SandgymError(
        'unsupported',
        `Task ${task.id} runs services beside its sandbox (${services.map((s) => s.name).join(', ')}), which so far only the embedded platform does`,
      );
    const network = await host.createGroupNetwork();
    const group = new TaskServices(network, []);
    try {
      const started: { service: TaskService; environment: Environment }[] = [];
      for (const service of services) {
        const environment = await serviceEnvironment(host, task, service, notes);
        const sandbox = await platform.createSandbox({
          environment: `${environment.name}:${environment.version}`,
          env: service.env,
          labels: { service: service.name },
          ...inRun,
        });
        group.running.push({ name: service.name, sandbox, address: await network.join(sandbox) });
        started.push({ service, environment });
      }
      for (const member of group.running) await group.writeHosts(member.sandbox, member.name);
      for (const [i, { service, environment }] of started.entries()) {
        const argv = serviceArgv(service, environment);
        if (argv.length === 0)
          throw new SandgymError(
            'invalid_argument',
            `Task ${task.id}: service "${service.name}" has nothing to run: give it a command in the compose file or a CMD in its image`,
          );
        const member = group.running[i]!;
        // long-lived: it runs until the group closes; how it ended is for the readiness check
        void member.sandbox
          .execStream(argv, { cwd: environment.config.workdir, env: service.env })
          .result.catch(() => undefined);
      }
      for (const [i, { service, environment }] of started.entries())
        await waitForPorts(group.running[i]!.sandbox, exposedTcpPorts(environment), task, service.name);
      return group;
    } catch (error) {
      await group.close();
      throw error;
    }
  }

  /** Puts a sandbox of the task (the agent's, a grader) on the group, known there as `name`. */
  async join(sandbox: Sandbox, name: string): Promise<void> {
    checkHostName(name, 'A member name');
    this.joined.set(sandbox.id, await this.network.join(sandbox));
    await this.writeHosts(sandbox, name);
  }

  /**
   * Takes a task sandbox off the group: the agent's while it is graded, so nothing it left
   * running (a fake service on its own address, a writer racing the tests) reaches the services
   * or the grader.
   */
  async leave(sandbox: Sandbox): Promise<void> {
    const address = this.joined.get(sandbox.id);
    if (!address) return;
    this.joined.delete(sandbox.id);
    await this.network.leave(address);
  }

  /**
   * The group's names in the sandbox's /etc/hosts, after what it had there. Any other line that
   * names a member goes: an agent that pointed `db` at an address of its own in the hosts file
   * its diff carries into the grader must not steer the tests there.
   */
  private async writeHosts(sandbox: Sandbox, self: string): Promise<void> {
    const names = new Set([self, ...this.running.map((m) => m.name)]);
    const base = await sandbox.readFile('/etc/hosts').then(
      (b) => b.toString(),
      () => '127.0.0.1 localhost\n',
    );
    const kept = base
      .split('\n')
      .filter((line) => {
        const hosts = line.replace(/#.*/, '').trim().split(/\s+/).slice(1);
        return !hosts.some((host) => names.has(host));
      })
      .join('\n')
      .replace(/\n*$/, '\n');
    const entries = [
      `127.0.1.1 ${self} # sandgym group`,
      ...this.running.filter((m) => m.name !== self).map((m) => `${m.address} ${m.name} # sandgym group`),
    ];
    await sandbox.writeFile('/etc/hosts', `${kept}${entries.join('\n')}\n`);
  }

  /** Ends every service and removes the group's network. */
  async close(): Promise<void> {
    await Promise.all(this.running.map((m) => m.sandbox.close().catch(() => undefined)));
    await this.network.close();
  }
}

/** A service's environment: its Dockerfile built (cached step by step), or its image resolved. */
async function serviceEnvironment(
  platform: HostPlatform,
  task: Task,
  service: TaskService,
  notes: string[],
): Promise<Environment> {
  try {
    if (service.source.kind === 'image') {
      const resolved = await platform.resolveImage(service.source.ref);
      notes.push(...resolved.notes.map((n) => `service ${service.name}: ${n}`));
      return resolved.environment;
    }
    const built = await platform.buildFromDockerfile({
      file: service.source.dockerfile,
      context: service.source.context,
      ...(service.source.root ? { root: service.source.root } : {}),
      name: `${taskStorageStem('svc', task)}:${service.name}`,
      ...(task.buildTimeoutMs ? { timeoutMs: task.buildTimeoutMs } : {}),
    });
    notes.push(...built.notes.map((n) => `service ${service.name}: ${n}`));
    return built.environment;
  } catch (error) {
    // a service's Dockerfile or image is the task author's, as the main one is: their error, named
    throw TaskError.fromPreparing(
      task.id,
      isSandgymError(error)
        ? new SandgymError(error.code, `service "${service.name}": ${messageOf(error)}`, {
            cause: error,
            retryable: error.retryable,
          })
        : error,
    );
  }
}

async function waitForPorts(sandbox: Sandbox, ports: number[], task: Task, name: string): Promise<void> {
  if (ports.length === 0) return;
  const deadline = Date.now() + READY_TIMEOUT_MS;
  for (;;) {
    const listening = await listeningPorts(sandbox);
    if (ports.every((p) => listening.has(p))) return;
    if (Date.now() > deadline)
      throw new SandgymError(
        'invalid_argument',
        `Task ${task.id}: service "${name}" did not listen on port ${ports.filter((p) => !listening.has(p)).join(', ')} within ${READY_TIMEOUT_MS / 1000} s of starting`,
      );
    await new Promise((r) => setTimeout(r, READY_POLL_MS));
  }
}
