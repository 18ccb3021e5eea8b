import { z } from 'zod';
import { ENV_VAR_NAME, textWithoutNul } from '../../common/index.ts';
import { allowedHostsMisuse, allowedHostsSchema, networkModeSchema } from './harbor-network.ts';
import { taskNumber } from './task.ts';

/**
 * Harbor's task.toml (harbor 0.26, `harbor.models.task.config.TaskConfig`, schema 1.0 to 1.4),
 * every field of it: each is honoured, or refused with a message naming it and why. Keys Harbor's
 * model does not know are ignored, as its model ignores them (a task written for a later Harbor
 * still loads). Defaults are Harbor's where it has one; where Harbor leaves a resource to its
 * provider, the common providers' default (1 CPU, 2048 MB) is used.
 */

/**
 * A field sandgym cannot honour: given, it is an error naming why and what to change (an empty
 * list, Harbor's own default, asks for nothing and passes).
 */
function refused(why: string) {
  return z
    .unknown()
    .refine((value) => value === undefined || (Array.isArray(value) && value.length === 0), { message: why })
    .optional();
}

const envTable = z
  .record(z.string().regex(ENV_VAR_NAME, 'env names are letters, digits and _'), textWithoutNul())
  .default({});

/** A user to run as: a name or, as Harbor takes it too, a uid. */
const taskUser = z
  .union([z.string().min(1), z.number().int().nonnegative()])
  .transform(String)
  .optional();

/** Seconds as Harbor writes them, kept as sandgym's milliseconds. */
const seconds = (check: z.ZodNumber) => check.transform((s) => Math.round(s * 1000));

/** `[environment.healthcheck]`: Docker HEALTHCHECK's options, with Harbor's defaults. */
const healthcheckSchema = z.object({
  command: textWithoutNul().min(1, 'is the shell line to run (exit 0: healthy)'),
  interval_sec: seconds(taskNumber.timeoutSeconds()).default(5000),
  timeout_sec: seconds(taskNumber.timeoutSeconds()).default(30_000),
  start_period_sec: seconds(
    z
      .number()
      .min(0)
      .max(7 * 24 * 3600),
  ).default(0),
  start_interval_sec: seconds(taskNumber.timeoutSeconds()).default(5000),
  retries: z.number().int().min(0).max(1000).default(3),
});

/** An HTTP header name as RFC 9110 allows it (Harbor's check too). */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** `[[environment.mcp_servers]]`: an MCP server offered to the agent. */
const mcpServerSchema = z
  .object({
    name: z.string().min(1),
    // Harbor's alias: "http" is streamable HTTP
    transport: z
      .preprocess((v) => (v === 'http' ? 'streamable-http' : v), z.enum(['stdio', 'sse', 'streamable-http']))
      .default('sse'),
    url: z.url().optional(),
    command: textWithoutNul().min(1).optional(),
    args: z.array(textWithoutNul()).default([]),
    headers: z
      .record(
        z.string().regex(HEADER_NAME, 'is not an HTTP header name'),
        z.string().regex(/^[^\r\n\0]*$/, 'must not contain a newline'),
      )
      .default({}),
  })
  .superRefine((server, ctx) => {
    if (server.transport !== 'stdio' && !server.url)
      ctx.addIssue({
        code: 'custom',
        path: ['url'],
        message: `is required for transport "${server.transport}"`,
      });
    if (server.transport === 'stdio' && !server.command)
      ctx.addIssue({ code: 'custom', path: ['command'], message: 'is required for transport "stdio"' });
    if (server.transport === 'stdio' && Object.keys(server.headers).length > 0)
      ctx.addIssue({ code: 'custom', path: ['headers'], message: 'are only for the HTTP transports' });
  });

/** Harbor's size strings of the deprecated `memory`/`storage` ("2G", "512M", "1024K") in MB. */
const legacySize = z
  .string()
  .regex(/^\s*\d+(\.\d+)?\s*[GMK]\s*$/i, 'is a size like "2G" or "512M" (or use the _mb field)')
  .transform((text) => {
    const t = text.trim().toUpperCase();
    const n = Number(t.slice(0, -1));
    return Math.trunc(t.endsWith('G') ? n * 1024 : t.endsWith('M') ? n : n / 1024);
  });

const NO_GPUS = 'this node has no GPUs: sandgym runs CPU-only sandboxes; remove it or set 0';

const environmentSchema = z
  .object({
    build_timeout_sec: taskNumber.timeoutSeconds().default(600),
    docker_image: z.string().min(1).optional(),
    os: z
      .preprocess((v) => (typeof v === 'string' ? v.toLowerCase() : v), z.enum(['linux', 'windows']))
      .refine((os) => os === 'linux', 'windows: sandgym runs Linux sandboxes only')
      .default('linux'),
    cpus: taskNumber.cpus().default(1),
    memory_mb: taskNumber.memoryMib().optional(),
    storage_mb: taskNumber.diskMib().optional(),
    memory: legacySize.optional(),
    storage: legacySize.optional(),
    gpus: z
      .number()
      .int()
      .nonnegative()
      .refine((n) => n === 0, NO_GPUS)
      .optional(),
    gpu_types: z.array(z.string()).optional(),
    tpu: refused('this node has no TPUs: sandgym runs CPU-only sandboxes; remove [environment.tpu]'),
    mcp_servers: z.array(mcpServerSchema).default([]),
    env: envTable,
    skills_dir: refused(
      "sandgym's agents have no skills folder to copy it to: put what the agent needs in the instruction or the image",
    ),
    healthcheck: healthcheckSchema.optional(),
    workdir: textWithoutNul().startsWith('/', 'must be an absolute path').optional(),
    // the older switch; network_mode is the newer one, and wins where both are given
    allow_internet: z.boolean().optional(),
    network_mode: networkModeSchema.optional(),
    allowed_hosts: allowedHostsSchema.optional(),
  })
  .superRefine((env, ctx) => {
    const conflict = (legacy: 'memory' | 'storage', mb: number | undefined) => {
      const field = `${legacy}_mb` as const;
      const current = env[field];
      if (mb !== undefined && current !== undefined && current !== mb)
        ctx.addIssue({
          code: 'custom',
          path: [legacy],
          message: `is ${mb} MB, but ${field} is ${current}: give only ${field}`,
        });
    };
    conflict('memory', env.memory);
    conflict('storage', env.storage);
    // the environment's mode is public when unset
    const misuse = allowedHostsMisuse(env, 'public');
    if (misuse) ctx.addIssue({ code: 'custom', path: ['allowed_hosts'], message: misuse });
  })
  .transform(({ memory, storage, memory_mb, storage_mb, ...rest }) => ({
    ...rest,
    // Harbor leaves memory to its provider when unset; its providers' common default is 2048 MB
    memory_mb: memory_mb ?? memory ?? 2048,
    storage_mb: storage_mb ?? storage,
  }));

const phaseNetwork = {
  network_mode: networkModeSchema.optional(),
  allowed_hosts: allowedHostsSchema.optional(),
};

/** A phase's allowed_hosts only with its own network_mode = "allowlist" (Harbor's rule). */
function checkPhaseNetwork(
  phase: { network_mode?: string | undefined; allowed_hosts?: string[] | undefined },
  ctx: z.RefinementCtx,
): void {
  const misuse = allowedHostsMisuse(phase as Parameters<typeof allowedHostsMisuse>[0]);
  if (misuse) ctx.addIssue({ code: 'custom', path: ['allowed_hosts'], message: misuse });
}

/** task.toml of a Harbor / Terminal-Bench 2 task; every section is optional. */
export const harborTaskTomlSchema = z.object({
  version: z.string().optional(),
  schema_version: z.string().optional(),
  task: z
    .object({
      name: z
        .string()
        .regex(/^[a-zA-Z0-9][a-zA-Z0-9._-]*\/[a-zA-Z0-9][a-zA-Z0-9._-]*$/, 'is "org/name"')
        .refine((name) => !name.includes('..'), 'must not contain ".."'),
      version: z.string().min(1).optional(),
      description: z.string().optional(),
    })
    .optional(),
  metadata: z.record(z.string(), z.unknown()).optional(),
  source: z.string().optional(),
  verifier: z
    .object({
      // Harbor's default (VerifierConfig.timeout_sec)
      timeout_sec: taskNumber.timeoutSeconds().default(600),
      env: envTable,
      user: taskUser,
      // Harbor's `separate` is sandgym's fresh grader
      environment_mode: z.enum(['shared', 'separate']).optional(),
      environment: refused(
        'sandgym grades in a fresh sandbox of the task\'s own environment, not a separate image: remove [verifier.environment] (environment_mode = "separate" alone is honoured)',
      ),
      collect: refused(
        'sandgym runs no collect hooks in services: have tests/test.sh read the state it checks',
      ),
      ...phaseNetwork,
    })
    .superRefine(checkPhaseNetwork)
    .prefault({}),
  agent: z
    .object({
      // Harbor sets no limit when absent; sandgym's episodes always have one
      timeout_sec: taskNumber.timeoutSeconds().default(600),
      user: taskUser,
      // sandgym's own (Harbor ignores keys it does not know): false has a model agent run one
      // tool call per answer and tell the model the others did not run
      parallel_tool_calls: z.boolean().optional(),
      ...phaseNetwork,
    })
    .superRefine(checkPhaseNetwork)
    .prefault({}),
  solution: z.object({ env: envTable }).prefault({}),
  environment: environmentSchema.prefault({}),
  steps: refused('sandgym runs single-step tasks only: split the steps into tasks of their own'),
  multi_step_reward_strategy: z.enum(['mean', 'final']).optional(),
  artifacts: refused(
    'sandgym does not collect artifacts: the agent may write /logs/artifacts, which its episode keeps',
  ),
});

/** A parsed task.toml. */
export type HarborTaskToml = z.infer<typeof harborTaskTomlSchema>;
