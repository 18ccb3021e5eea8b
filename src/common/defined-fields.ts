/** Removes the fields a caller left undefined: the shape exactOptionalPropertyTypes wants to pass on. */
export type DefinedFields<T> = { [K in keyof T]?: Exclude<T[K], undefined> };

/** A copy of `value` without its undefined fields. */
export function definedFields<T extends object>(value: T): DefinedFields<T> {
  return Object.fromEntries(
    Object.entries(value).filter(([, field]) => field !== undefined),
  ) as DefinedFields<T>;
}
