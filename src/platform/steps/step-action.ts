import { z } from 'zod';
import { issuesText, messageOf } from '../../common/index.ts';
import { sandboxActionSchema, type InvalidAction, type StepAction } from './actions.ts';

/** How much of an invalid action its record keeps: enough to see what it was, never its bulk. */
const KEPT = { stringChars: 1024, keyChars: 256, items: 64, depth: 6, values: 512 } as const;
/** The longest an invalid action's problem may be. */
const MAX_PROBLEM_CHARS = 4096;

/** A UTF-16 half with no other half: UTF-8 (and so the log, the wire, the sandbox) has no such thing. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/** The record of an invalid action, as a client or a log may hand it on. */
const invalidActionSchema = z.strictObject({
  type: z.literal('invalid'),
  problem: z.string(),
  given: z.unknown(),
});

function wellFormed(text: string): string {
  return text.replace(LONE_SURROGATE, '\uFFFD');
}

/** Text cut to `chars`, on a character boundary, marked when cut. */
function clip(text: string, chars: number): string {
  if (text.length <= chars) return wellFormed(text);
  const marker = `…[${text.length - chars} more characters]`;
  return wellFormed(text.slice(0, Math.max(0, chars - marker.length))) + marker;
}

/** Every string of a (valid, plain) action made well-formed, so its record reads back the same. */
function wellFormedStrings<T>(value: T): T {
  if (typeof value === 'string') return wellFormed(value) as T;
  if (Array.isArray(value)) return value.map(wellFormedStrings) as T;
  if (value && typeof value === 'object')
    return Object.fromEntries(
      Object.entries(value).map(([key, item]) => [wellFormed(key), wellFormedStrings(item)]),
    ) as T;
  return value;
}

/**
 * A copy of anything, as plain data a log can hold and read back the same: strings cut and made
 * well-formed; NaN, bigints, functions and symbols named; cycles, deep nesting and long lists cut
 * off; a getter that throws named. Deterministic, so a retried invalid step matches its record,
 * and a copy of a copy is the copy.
 */
function boundedCopy(value: unknown): unknown {
  let left = KEPT.values;
  const ancestors = new Set<object>();
  const copy = (item: unknown, depth: number): unknown => {
    if (--left < 0) return '…';
    switch (typeof item) {
      case 'string':
        return clip(item, KEPT.stringChars);
      case 'number':
        return Number.isFinite(item) ? item : String(item);
      case 'boolean':
        return item;
      case 'bigint':
        return `${item}n`;
      case 'undefined':
        return null;
      case 'function':
        return '[function]';
      case 'symbol':
        return '[symbol]';
    }
    if (item === null || typeof item !== 'object') return null;
    if (depth >= KEPT.depth) return '[nested too deep]';
    if (ancestors.has(item)) return '[circular]';
    ancestors.add(item);
    try {
      // a list cut short ends in a marker, copied like any value: a copy of a copy is the same
      if (Array.isArray(item)) {
        const cut = item.length > KEPT.items;
        const kept = item
          .slice(0, cut ? KEPT.items - 1 : KEPT.items)
          .map((element) => copy(element, depth + 1));
        return cut ? [...kept, copy(`…[${item.length - kept.length} more items]`, depth + 1)] : kept;
      }
      const keys = Object.keys(item);
      const cut = keys.length > KEPT.items;
      const entries = keys.slice(0, cut ? KEPT.items - 1 : KEPT.items).map((key): [string, unknown] => [
        // a log's decoder drops `__proto__`
        key === '__proto__' ? '[__proto__]' : clip(key, KEPT.keyChars),
        copy((item as Record<string, unknown>)[key], depth + 1),
      ]);
      if (cut) entries.push(['…', copy(`${keys.length - entries.length} more keys`, depth + 1)]);
      return Object.fromEntries(entries);
    } catch (error) {
      return `[unreadable: ${clip(messageOf(error), KEPT.keyChars)}]`;
    } finally {
      ancestors.delete(item);
    }
  };
  return copy(value, 0);
}

function invalid(problem: string, given: unknown): InvalidAction {
  return { type: 'invalid', problem: clip(problem, MAX_PROBLEM_CHARS), given: boundedCopy(given) };
}

/**
 * What a step carries for whatever a policy gave as its action: the action, validated, or the
 * record of an invalid one (why, and a bounded copy of what was given). Never throws: an invalid
 * action is an observation of its step, logged and scored like any other, never a failure of the
 * platform a rollout would mask. The one place every door (SandboxEnv, the node's steps, the
 * Envs service) reads an action through; a record it made passes through it unchanged.
 */
export function stepActionOf(given: unknown): StepAction {
  try {
    const recorded = invalidActionSchema.safeParse(given);
    if (recorded.success) return invalid(recorded.data.problem, recorded.data.given);
    const parsed = sandboxActionSchema.safeParse(given);
    return parsed.success ? wellFormedStrings(parsed.data) : invalid(issuesText(parsed.error), given);
  } catch (error) {
    // a getter or a proxy that throws while the action is read
    return invalid(`the action cannot be read: ${messageOf(error)}`, given);
  }
}
