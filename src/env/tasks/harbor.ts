import { existsSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { SandgymError, parseAt } from '../../common/index.ts';
import { composeServices } from './compose.ts';
import { resolveEnvTemplates, type HostEnvOptions } from './env-templates.ts';
import { harborNetwork } from './harbor-network.ts';
import { harborTaskTomlSchema, type HarborTaskToml } from './harbor-schema.ts';
import { readTaskFile, readTaskText, taskPath } from './task-file.ts';
import type { Task, TaskHealthcheck, TaskMcpServer } from './task.ts';

/** Where Harbor puts a task's solution folder for its oracle (and where tasks may ask for answers). */
export const HARBOR_SOLUTION_DIR = '/solution';

/** True when the folder looks like one Harbor task (it has a task.toml). */
export function isHarborTask(dir: string): boolean {
  return existsSync(join(dir, 'task.toml'));
}

/** The healthcheck as a Task holds it (its times in ms). */
function healthcheckOf(toml: HarborTaskToml): TaskHealthcheck | undefined {
  const check = toml.environment.healthcheck;
  return check
    ? {
        command: check.command,
        intervalMs: check.interval_sec,
        timeoutMs: check.timeout_sec,
        startPeriodMs: check.start_period_sec,
        startIntervalMs: check.start_interval_sec,
        retries: check.retries,
      }
    : undefined;
}

/** The MCP servers as a Task holds them. */
function mcpServersOf(toml: HarborTaskToml): TaskMcpServer[] {
  return toml.environment.mcp_servers.map((server) => ({
    name: server.name,
    transport: server.transport,
    ...(server.url ? { url: server.url } : {}),
    ...(server.command ? { command: server.command } : {}),
    args: server.args,
    headers: server.headers,
  }));
}

/**
 * Loads one Harbor task folder; every error names the file and the field to fix. `${VAR}`
 * templates in its env tables read the host only for variables `options` allows (see
 * resolveEnvTemplates).
 */
export async function loadHarborTask(path: string, options: HostEnvOptions = {}): Promise<Task> {
  const dir = resolve(path);
  const tomlPath = join(dir, 'task.toml');
  const toml = parseAt(harborTaskTomlSchema, await readTaskFile(dir, 'task.toml', 'TOML'), tomlPath);
  const envOf = (table: Record<string, string>, section: string) =>
    resolveEnvTemplates(table, `${tomlPath} [${section}] env`, options);
  const healthcheck = healthcheckOf(toml);
  const mcpServers = mcpServersOf(toml);
  const image = toml.environment.docker_image;
  // a prebuilt image stands in for the Dockerfile
  const required = ['instruction.md', ...(image ? [] : ['environment/Dockerfile']), 'tests/test.sh'];
  for (const file of required) {
    if (!existsSync(join(dir, file))) {
      throw new SandgymError(
        'invalid_argument',
        `Task ${dir} has no ${file}: a Harbor task needs ${required.join(', ')}`,
      );
    }
  }
  // every folder and file the task names is found beneath its folder: none may be a host's
  const solution = await taskPath(dir, 'solution');
  const environment = await taskPath(dir, 'environment');
  const services = await composeServices(dir, environment);
  return {
    id: basename(dir),
    format: 'harbor',
    source: dir,
    instruction: await readTaskText(dir, 'instruction.md'),
    environment: image
      ? { kind: 'image', ref: image }
      : {
          kind: 'dockerfile',
          dockerfile: await taskPath(dir, 'environment/Dockerfile'),
          context: environment,
          root: dir,
        },
    ...(services.length ? { services } : {}),
    grading: { kind: 'reward_file', testsDir: await taskPath(dir, 'tests') },
    resources: {
      cpu: toml.environment.cpus,
      memoryMib: toml.environment.memory_mb,
      ...(toml.environment.storage_mb ? { diskMib: Math.max(16, toml.environment.storage_mb) } : {}),
    },
    env: envOf(toml.environment.env, 'environment'),
    verifierEnv: envOf(toml.verifier.env, 'verifier'),
    ...(toml.agent.user ? { agentUser: toml.agent.user } : {}),
    ...(toml.agent.parallel_tool_calls === undefined
      ? {}
      : { parallelToolCalls: toml.agent.parallel_tool_calls }),
    ...(toml.verifier.user ? { verifierUser: toml.verifier.user } : {}),
    agentTimeoutMs: toml.agent.timeout_sec * 1000,
    verifierTimeoutMs: toml.verifier.timeout_sec * 1000,
    buildTimeoutMs: toml.environment.build_timeout_sec * 1000,
    network: harborNetwork(toml),
    ...(healthcheck ? { healthcheck } : {}),
    ...(mcpServers.length ? { mcpServers } : {}),
    // Harbor's default is its agent's container; sandgym's is a fresh grader (docs/tasks.md)
    ...(toml.verifier.environment_mode
      ? { verifierMode: toml.verifier.environment_mode === 'shared' ? 'shared' : 'fresh' }
      : {}),
    ...(toml.environment.workdir ? { workdir: toml.environment.workdir } : {}),
    hiddenPaths: ['/tests', HARBOR_SOLUTION_DIR],
    oracle: existsSync(join(solution, 'solve.sh'))
      ? { kind: 'script', dir: solution, env: envOf(toml.solution.env, 'solution') }
      : undefined,
  };
}
