import { existsSync } from 'node:fs';
import { isAbsolute, join } from 'node:path';
import { z } from 'zod';
import { SandgymError, parseAt, resolveBeneath } from '../../common/index.ts';
import type { TaskService } from './task.ts';
import { readTaskFile } from './task-file.ts';

/** The service that is the task's own sandbox: Terminal-Bench calls it `client`, Harbor `main`. */
const MAIN_SERVICES = new Set(['client', 'main']);
const COMPOSE_FILES = ['docker-compose.yaml', 'docker-compose.yml', 'compose.yaml', 'compose.yml'];
const SERVICE_NAME = /^[a-z0-9][a-z0-9_-]{0,62}$/;

const commandSchema = z.union([z.string(), z.array(z.string())]);
const serviceSchema = z
  .object({
    build: z
      .union([
        z.string(),
        z
          .object({ context: z.string().default('.'), dockerfile: z.string().default('Dockerfile') })
          .passthrough(),
      ])
      .optional(),
    image: z.string().optional(),
    command: commandSchema.optional(),
    entrypoint: commandSchema.optional(),
    environment: z
      .union([
        z.array(z.string()),
        z.record(z.string(), z.union([z.string(), z.number(), z.boolean()]).nullable()),
      ])
      .optional(),
  })
  .passthrough();
const composeSchema = z
  .object({
    services: z.record(z.string().regex(SERVICE_NAME, 'service names are a-z, 0-9, _ and -'), serviceSchema),
  })
  .passthrough();

/** A compose command: a list as it is, a string through the shell (as `sh -c` would split it). */
function argv(command: z.infer<typeof commandSchema> | undefined): string[] | undefined {
  if (command === undefined) return undefined;
  return typeof command === 'string' ? ['/bin/sh', '-c', command] : command;
}

function environment(value: z.infer<typeof serviceSchema>['environment']): Record<string, string> {
  if (!value) return {};
  const pairs: [string, string][] = Array.isArray(value)
    ? value.map((entry): [string, string] => {
        const eq = entry.indexOf('=');
        return eq < 0 ? [entry, ''] : [entry.slice(0, eq), entry.slice(eq + 1)];
      })
    : Object.entries(value).map(([k, v]): [string, string] => [k, v === null ? '' : String(v)]);
  // ${VAR} values name the harness's own variables, which mean nothing here: left out
  return Object.fromEntries(pairs.filter(([, v]) => !/\$\{?[A-Za-z_]/.test(v)));
}

/**
 * The services of a task's docker-compose file besides its own sandbox (`client` or `main`): a
 * database the tests talk to, say. Each is built from its Dockerfile or taken from an image and
 * started with its command; all of them run with the task's sandbox as one group on a private
 * network where each is reachable by its service name. None when the folder has no compose file
 * or it names only the task's sandbox. `dir` is the compose file's folder, `root` the task's: a
 * build context or Dockerfile the file names must lie beneath `root`, symlinks followed.
 */
export async function composeServices(root: string, dir: string): Promise<TaskService[]> {
  const name = COMPOSE_FILES.find((candidate) => existsSync(join(dir, candidate)));
  if (!name) return [];
  const file = join(dir, name);
  const compose = parseAt(composeSchema, await readTaskFile(dir, name, 'YAML'), file);
  const services: TaskService[] = [];
  for (const [name, service] of Object.entries(compose.services)) {
    if (MAIN_SERVICES.has(name)) continue;
    const where = `${file} service "${name}"`;
    let source: TaskService['source'];
    if (service.build !== undefined) {
      const build =
        typeof service.build === 'string'
          ? { context: service.build, dockerfile: 'Dockerfile' }
          : service.build;
      // both are relative to the compose file's folder, and found beneath the task's
      for (const [field, value] of [
        ['build context', build.context],
        ['dockerfile', build.dockerfile],
      ] as const)
        if (isAbsolute(value))
          throw new SandgymError(
            'invalid_argument',
            `${where}: ${field} "${value}" is an absolute path: name a path inside the task folder`,
          );
      // (joined as text: a `..` after a symlink climbs from where the link leads, as in Docker)
      const context = await resolveBeneath(root, `${dir}/${build.context}`, `${where}: build context`);
      const dockerfile = await resolveBeneath(root, `${context}/${build.dockerfile}`, `${where}: dockerfile`);
      source = { kind: 'dockerfile', dockerfile, context, root };
    } else if (service.image) {
      source = { kind: 'image', ref: service.image };
    } else {
      throw new SandgymError('invalid_argument', `${where}: give it a build or an image`);
    }
    const command = argv(service.command);
    const entrypoint = argv(service.entrypoint);
    services.push({
      name,
      source,
      ...(command ? { command } : {}),
      ...(entrypoint ? { entrypoint } : {}),
      env: environment(service.environment),
    });
  }
  return services;
}
