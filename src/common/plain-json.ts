import { messageOf } from './errors.ts';

/** How deep {@link plainJson}'s fallback copies before it names the rest. */
const MAX_DEPTH = 64;

/**
 * `value` as JSON text, whatever it holds: JSON.stringify when it can; else a copy where what JSON
 * cannot hold is named instead (a bigint as `10n`, a cycle, a `toJSON` or getter that throws,
 * nesting past {@link MAX_DEPTH}). Never throws: for files that must keep what finished (a
 * journal), one odd value never costs the rest.
 */
export function plainJson(value: unknown): string {
  try {
    return JSON.stringify(value) ?? 'null';
  } catch {
    return JSON.stringify(plainCopy(value));
  }
}

function plainCopy(value: unknown): unknown {
  const ancestors = new Set<object>();
  const copy = (item: unknown, depth: number): unknown => {
    if (typeof item === 'bigint') return `${item}n`;
    if (typeof item === 'number') return Number.isFinite(item) ? item : String(item);
    if (typeof item === 'string' || typeof item === 'boolean' || item === null) return item;
    if (typeof item !== 'object') return undefined;
    if (depth >= MAX_DEPTH) return '[nested too deep]';
    if (ancestors.has(item)) return '[circular]';
    ancestors.add(item);
    try {
      const toJSON = (item as { toJSON?: unknown }).toJSON;
      if (typeof toJSON === 'function') return copy(toJSON.call(item), depth + 1);
      if (Array.isArray(item)) return item.map((element) => copy(element, depth + 1) ?? null);
      return Object.fromEntries(
        Object.keys(item).map((key) => {
          try {
            return [key, copy((item as Record<string, unknown>)[key], depth + 1)];
          } catch (error) {
            return [key, `[unreadable: ${messageOf(error)}]`];
          }
        }),
      );
    } catch (error) {
      return `[unreadable: ${messageOf(error)}]`;
    } finally {
      ancestors.delete(item);
    }
  };
  return copy(value, 0) ?? null;
}
