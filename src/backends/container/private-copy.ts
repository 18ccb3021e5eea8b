import { filterDiffTree, type DiffFilter, type FilterReport } from '../host/diff-filter.ts';

/** A private copy of a container's writable layer: a btrfs snapshot of its `rw` subvolume. */
export interface PrivateCopy {
  /** The copy of the upper dir: what the sandbox wrote. */
  tree: string;
  /** A folder beside it, in the same copy, where pruned entries go. */
  trash: string;
  /** Removes overlay opaque marks of folders in the copy; returns those that had one. */
  clearOpaque(dirs: string[]): Promise<string[]>;
  /** Deletes the copy. */
  dispose(): Promise<void>;
}

/** What an unfiltered layer reports: nothing. */
export const NOTHING_FILTERED: FilterReport = { present: [], dropped: [] };

/** Prunes a private copy by `filter`, hands it to `consume`, and deletes it whatever happens. */
export async function consumeFiltered<T>(
  copy: PrivateCopy,
  filter: DiffFilter,
  consume: (dir: string, report: FilterReport) => Promise<T>,
): Promise<T> {
  try {
    const report = await filterDiffTree(copy.tree, copy.trash, filter, (dirs) => copy.clearOpaque(dirs));
    return await consume(copy.tree, report);
  } finally {
    await copy.dispose();
  }
}
