import { existsSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { z } from 'zod';
import { ENV_VAR_NAME, SandgymError, parseAt } from '../../common/index.ts';
import { composeServices } from './compose.ts';
import { readTaskFile, readTaskText, taskPath } from './task-file.ts';
import { PUBLIC_NETWORK, taskNumber, type NetworkPolicy, type Task } from './task.ts';

/** Where Harbor puts a task's solution folder for its oracle (and where tasks may ask for answers). */
export const HARBOR_SOLUTION_DIR = '/solution';

/** task.toml of a Harbor / Terminal-Bench 2 task; every section is optional. */
const envTable = z
  .record(z.string().regex(ENV_VAR_NAME, 'env names are letters, digits and _'), z.string())
  .default({});

/** Harbor's network modes; `allowlist` gets the node's mirrors, the only hosts it can name here. */
const networkMode = z.enum(['public', 'no-network', 'allowlist']).optional();

/** The rules of a Harbor network mode on this node. */
function rulesOf(mode: 'public' | 'no-network' | 'allowlist'): string[] {
  return mode === 'no-network'
    ? []
    : mode === 'public'
      ? [...PUBLIC_NETWORK]
      : ['mirror:debian?', 'mirror:npm?', 'dns?'];
}

/** A user to run as: a name or, as Harbor takes it too, a uid. */
const taskUser = z
  .union([z.string().min(1), z.number().int().nonnegative()])
  .transform(String)
  .optional();

const taskTomlSchema = z.object({
  verifier: z
    .object({
      // Harbor's default (VerifierConfig.timeout_sec)
      timeout_sec: taskNumber.timeoutSeconds().default(600),
      env: envTable,
      user: taskUser,
      network_mode: networkMode,
    })
    .prefault({}),
  agent: z
    .object({
      timeout_sec: taskNumber.timeoutSeconds().default(600),
      user: taskUser,
      network_mode: networkMode,
    })
    .prefault({}),
  solution: z.object({ env: envTable }).prefault({}),
  environment: z
    .object({
      docker_image: z.string().optional(),
      build_timeout_sec: taskNumber.timeoutSeconds().default(600),
      cpus: taskNumber.cpus().default(1),
      memory_mb: taskNumber.memoryMib().default(1024),
      storage_mb: taskNumber.diskMib().optional(),
      // the older switch; network_mode is the newer one, and wins where both are given
      allow_internet: z.boolean().optional(),
      network_mode: networkMode,
      env: envTable,
    })
    .prefault({}),
});

/**
 * A Harbor task's network as Harbor gives it: the environment's mode (`network_mode`, or the
 * older `allow_internet`; public when neither says), which `[agent]` and `[verifier]` may each
 * override. Public is what Harbor's containers have by default; here it is the node's internet
 * and package mirrors where it has them (see PUBLIC_NETWORK).
 */
function harborNetwork(toml: z.infer<typeof taskTomlSchema>): NetworkPolicy {
  const base =
    toml.environment.network_mode ?? (toml.environment.allow_internet === false ? 'no-network' : 'public');
  return {
    setup: rulesOf(base),
    agent: rulesOf(toml.agent.network_mode ?? base),
    verify: rulesOf(toml.verifier.network_mode ?? base),
  };
}

/** True when the folder looks like one Harbor task (it has a task.toml). */
export function isHarborTask(dir: string): boolean {
  return existsSync(join(dir, 'task.toml'));
}

/** Loads one Harbor task folder; every error names the file and the field to fix. */
export async function loadHarborTask(path: string): Promise<Task> {
  const dir = resolve(path);
  const tomlPath = join(dir, 'task.toml');
  const toml = parseAt(taskTomlSchema, await readTaskFile(dir, 'task.toml', 'TOML'), tomlPath);
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
    env: toml.environment.env,
    verifierEnv: toml.verifier.env,
    ...(toml.agent.user ? { agentUser: toml.agent.user } : {}),
    ...(toml.verifier.user ? { verifierUser: toml.verifier.user } : {}),
    agentTimeoutMs: toml.agent.timeout_sec * 1000,
    verifierTimeoutMs: toml.verifier.timeout_sec * 1000,
    buildTimeoutMs: toml.environment.build_timeout_sec * 1000,
    network: harborNetwork(toml),
    hiddenPaths: ['/tests', HARBOR_SOLUTION_DIR],
    oracle: existsSync(join(solution, 'solve.sh'))
      ? { kind: 'script', dir: solution, env: toml.solution.env }
      : undefined,
  };
}
