import { requestFields, type IdKind } from '../../common/index.ts';
import type { Principal } from './principal.ts';
import type { MethodDef } from './service.ts';

/**
 * Looks up one id of a request for the caller's project before the handler runs, and throws
 * `not_found` (worded as for an id never made) when the project does not own it.
 */
export type IdResolver = (id: string, principal: Principal) => unknown;

/** A server's resolvers, one per kind of id its methods carry. */
export type IdResolvers = Partial<Record<IdKind, IdResolver>>;

/** Resolves every id a decoded request carries, in field order; the handler runs only after. */
export type RequestResolution = (request: unknown, principal: Principal) => Promise<void>;

/**
 * How a method's requests are resolved: every `ref` field by the resolver of its kind. Compiled
 * once, when the server starts, so a method that carries an id nothing resolves, a `scoped` id
 * without the field it is scoped by, or a text field nobody declared stops the server from
 * starting, naming the field: a new RPC cannot forget the check.
 */
export function requestResolution(
  where: string,
  method: MethodDef,
  resolvers: IdResolvers,
): RequestResolution {
  const fields = requestFields(method.request);
  const refs: { kind: IdKind; path: string[]; resolve: IdResolver }[] = [];
  for (const { path, role } of fields) {
    const field = `${where} ${path.join('.') || '(request)'}`;
    if (!role) {
      throw new Error(
        `${field} is a string nobody declared: use ids.<kind>() or names.<kind>() for an id, notAnId() for text (src/common/id-fields.ts)`,
      );
    }
    if (
      role.role === 'scoped' &&
      !fields.some((other) => other.role?.role === 'ref' && other.role.kind === role.within)
    )
      throw new Error(
        `${field} is a ${role.kind} id scoped by a ${role.within} id, and the request has none`,
      );
    if (role.role !== 'ref') continue;
    if (path.includes('(key)')) throw new Error(`${field}: a ${role.kind} id cannot be a map key`);
    const resolve = resolvers[role.kind];
    if (!resolve)
      throw new Error(`${field} is a ${role.kind} id, and this server has no ${role.kind} resolver`);
    refs.push({ kind: role.kind, path, resolve });
  }
  return async (request, principal) => {
    for (const { path, resolve } of refs)
      for (const id of valuesAt(request, path)) if (typeof id === 'string') await resolve(id, principal);
  };
}

/** The values at `path` in a decoded request (`*`: every element or value); none where it is absent. */
function valuesAt(value: unknown, path: readonly string[]): unknown[] {
  if (path.length === 0) return value === undefined ? [] : [value];
  if (value === null || typeof value !== 'object') return [];
  const [step, ...rest] = path as [string, ...string[]];
  const next =
    step === '*' ? Object.values(value) : step in value ? [(value as Record<string, unknown>)[step]] : [];
  return next.flatMap((child) => valuesAt(child, rest));
}
