import { SandgymError } from '../../common/index.ts';

/**
 * The variable that lets Harbor task templates read the host's environment: a comma-separated
 * list of names (`SANDGYM_TASK_ENV=HF_TOKEN,WANDB_PROJECT`).
 */
const TASK_ENV_VARIABLE = 'SANDGYM_TASK_ENV';

/** What a task's `${VAR}` templates may read of the host, resolved once at load. */
export interface HostEnvOptions {
  /** Host variables a task may read by name, over those `$SANDGYM_TASK_ENV` lists. */
  taskEnv?: readonly string[];
  /** The host's environment; default process.env. */
  hostEnv?: NodeJS.ProcessEnv;
}

/** A whole value `${NAME}` or `${NAME:-default}`, as Harbor matches it (anything else is literal). */
const TEMPLATE = /^\$\{([^}:]+)(?::-(.*))?\}$/s;

/**
 * Resolves an env table's templates (Harbor's `${VAR}` and `${VAR:-default}`, the whole value).
 *
 * The task's author writes the template and the host's environment holds the user's secrets: a
 * task asking for `${OPENAI_API_KEY}` would copy the key into a sandbox the agent controls. So a
 * variable is read from the host only when the user allowed its name (`taskEnv`, or
 * `$SANDGYM_TASK_ENV`); otherwise the template's default is used, and with no default the load
 * fails naming the variable, the file and how to allow it.
 */
export function resolveEnvTemplates(
  table: Record<string, string>,
  where: string,
  options: HostEnvOptions = {},
): Record<string, string> {
  const hostEnv = options.hostEnv ?? process.env;
  const allowed = new Set([
    ...(options.taskEnv ?? []),
    ...(hostEnv[TASK_ENV_VARIABLE] ?? '')
      .split(',')
      .map((name) => name.trim())
      .filter(Boolean),
  ]);
  const resolved: Record<string, string> = {};
  for (const [key, value] of Object.entries(table)) {
    const match = TEMPLATE.exec(value);
    if (!match) {
      resolved[key] = value;
      continue;
    }
    const [, name = '', fallback] = match;
    const host = allowed.has(name) ? hostEnv[name] : undefined;
    if (host !== undefined) resolved[key] = host;
    else if (fallback !== undefined) resolved[key] = fallback;
    else
      throw new SandgymError(
        'invalid_argument',
        `${where}: ${key} = "\${${name}}" reads the host's ${name}, which ${
          allowed.has(name) ? 'is not set' : 'this task is not allowed to read'
        }: allow it with --task-env ${name} (or ${TASK_ENV_VARIABLE}=${name}) and set it, or give the template a default ("\${${name}:-value}")`,
      );
  }
  return resolved;
}
