import type { NetworkRecord } from './contract.ts';

/** A stage's record in words: "could not resolve a.example; denied 10.1.2.3:443/tcp" ('' if empty). */
export function recordText(record: NetworkRecord): string {
  return [
    ...(record.unresolved.length ? [`could not resolve ${record.unresolved.join(', ')}`] : []),
    ...(record.denied.length ? [`denied ${record.denied.join(', ')}`] : []),
  ].join('; ');
}
