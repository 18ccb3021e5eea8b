import { z } from 'zod';
import { textWithoutNul } from './validation.ts';

/**
 * The kinds of id a request can carry. Each names something one project owns: a sandbox, a
 * memory checkpoint of a sandbox, a layer (by digest), an environment (name:version), a served
 * env, a served env's checkpoint, a run, an episode.
 */
export const ID_KINDS = [
  'sandbox',
  'checkpoint',
  'layer',
  'environment',
  'env',
  'envCheckpoint',
  'run',
  'episode',
] as const;
export type IdKind = (typeof ID_KINDS)[number];

/**
 * What a field of a request is, for the server that resolves ids before its handlers run:
 * - `ref`: an id of something that exists, looked up against the caller's project by the
 *   server's resolver for its kind; another project's is `not_found`, as one never made.
 * - `scoped`: an id looked up only inside the resource the same request names by a `ref` of
 *   kind `within` (a checkpoint on its sandbox's shelf, an episode in its sandbox's log), so it
 *   resolves through that ref and can name nothing of another project's.
 * - `name`: a name the caller gives something new, written under its own project (a run, an
 *   environment it packs), so it cannot reach another project's of the same name.
 * - `text`: names nothing (paths, commands, labels, descriptions).
 */
export type FieldRole =
  | { role: 'ref'; kind: IdKind }
  | { role: 'scoped'; kind: IdKind; within: IdKind }
  | { role: 'name'; kind: IdKind }
  | { role: 'text' };

const roles = z.registry<FieldRole>();

function declared<S extends z.ZodType>(schema: S, role: FieldRole): S {
  roles.add(schema, role);
  return schema;
}

const SANDBOX_ID = /^sg-[a-z0-9]{1,32}-[a-z0-9]{12}$/;
const LAYER_DIGEST = /^sha256:[0-9a-f]{64}$/;
const RUN_NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const runName = () => z.string().regex(RUN_NAME, 'run names are a-z, 0-9, ., _ and -');
/** "name:version"; what makes a valid one is the store's to say (parseEnvironmentRef). */
const environmentRef = () => z.string().min(1).max(160);

/**
 * Id fields of requests, one helper per kind: every id a request carries is declared with one of
 * these, so the server can find it and resolve it against the caller's project before a handler
 * sees it (see `docs/security.md`, "Ids").
 */
export const ids = {
  sandbox: () =>
    declared(z.string().regex(SANDBOX_ID, 'a sandbox id, sg-<node>-<12 chars>'), {
      role: 'ref',
      kind: 'sandbox',
    }),
  layer: () =>
    declared(z.string().regex(LAYER_DIGEST, 'layer digests are sha256:<64 hex>'), {
      role: 'ref',
      kind: 'layer',
    }),
  environment: () => declared(environmentRef(), { role: 'ref', kind: 'environment' }),
  env: () =>
    declared(z.string().regex(/^env-[a-z0-9]{1,32}-[a-z0-9]{12}$/, 'an env id, env-<node>-<12 chars>'), {
      role: 'ref',
      kind: 'env',
    }),
  envCheckpoint: () =>
    declared(z.string().regex(/^ckpt-[a-z0-9]{16}$/, 'a checkpoint id from Checkpoint'), {
      role: 'ref',
      kind: 'envCheckpoint',
    }),
  run: () => declared(runName(), { role: 'ref', kind: 'run' }),
  /** A memory checkpoint, on the shelf of the sandbox the request names. */
  checkpoint: () =>
    declared(z.string().regex(/^(ckpt|snap)-[0-9a-f]{12,16}$/, 'a checkpoint id from Checkpoint'), {
      role: 'scoped',
      kind: 'checkpoint',
      within: 'sandbox',
    }),
  /** An episode of the sandbox or served env the request names. */
  episode: (within: 'sandbox' | 'env') =>
    declared(textWithoutNul().min(1).max(256), { role: 'scoped', kind: 'episode', within }),
};

/** Names a request gives new things of the caller's project (see {@link FieldRole}). */
export const names = {
  run: () => declared(runName(), { role: 'name', kind: 'run' }),
  environment: () => declared(environmentRef(), { role: 'name', kind: 'environment' }),
};

/** Declares a request field (or a whole subtree) as naming nothing a project owns. */
export function notAnId<S extends z.ZodType>(schema: S): S {
  return declared(schema, { role: 'text' });
}

/** One field of a request schema: where it is (`*` for any element or value) and its role. */
export interface RequestField {
  path: string[];
  /** Undefined for a field of free text (or unknown content) that nothing declared. */
  role: FieldRole | undefined;
}

/**
 * Every field of a request schema that can hold text: declared ones with their role, and the
 * strings and unknown values nobody declared (which a unit test refuses). Unions contribute the
 * fields of every option.
 */
export function requestFields(schema: z.ZodType, path: string[] = []): RequestField[] {
  const role = roles.get(schema);
  if (role) return [{ path, role }];
  const def = schema.def as unknown as Record<string, unknown> & { type: string };
  const inner = (key: string): z.ZodType => def[key] as z.ZodType;
  switch (def.type) {
    case 'object':
      return Object.entries((schema as z.ZodObject).shape).flatMap(([key, field]) =>
        requestFields(field as z.ZodType, [...path, key]),
      );
    case 'optional':
    case 'nullable':
    case 'default':
    case 'prefault':
    case 'readonly':
    case 'nonoptional':
    case 'catch':
      return requestFields(inner('innerType'), path);
    case 'pipe':
      return requestFields(inner('in'), path);
    case 'array':
      return requestFields(inner('element'), [...path, '*']);
    case 'record':
      return [
        ...requestFields(inner('keyType'), [...path, '(key)']),
        ...requestFields(inner('valueType'), [...path, '*']),
      ];
    case 'union':
      return (def['options'] as z.ZodType[]).flatMap((option) => requestFields(option, path));
    case 'string':
    case 'unknown':
    case 'any':
      return [{ path, role: undefined }];
    case 'number':
    case 'int':
    case 'boolean':
    case 'enum':
    case 'literal':
    case 'custom':
      // numbers, flags, fixed words and bytes name nothing
      return [];
    default:
      // a shape this walk does not know could hide an id: say so rather than pass it
      throw new Error(
        `Cannot walk a zod ${def.type} at ${path.join('.') || '(root)'}: teach requestFields it`,
      );
  }
}
