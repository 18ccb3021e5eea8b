import { filterDiffTree, type DiffFilter, type DiffTree, type FilterReport } from '../host/diff-filter.ts';

/**
 * A private copy of a container's writable layer: a btrfs snapshot of its `rw` subvolume, whose
 * `tree` is the copy of the upper dir (what the sandbox wrote).
 */
export interface PrivateCopy extends DiffTree {
  /** Deletes the copy. */
  dispose(): Promise<void>;
}

/** What an unfiltered layer reports: nothing. */
export const NOTHING_FILTERED: FilterReport = {
  present: [],
  dropped: [],
  excludedByPattern: [],
  excludedByPatternCut: false,
};

/**
 * Prunes a private copy by `filter`, hands it to `consume`, and deletes it whatever happens. The
 * copy may hold no more than `diskMib`, the sandbox's disk cap, of files by their apparent size
 * (see filterDiffTree): what the sandbox could have written, sparse files or not.
 */
export async function consumeFiltered<T>(
  copy: PrivateCopy,
  filter: DiffFilter,
  diskMib: number,
  consume: (dir: string, report: FilterReport) => Promise<T>,
): Promise<T> {
  try {
    const report = await filterDiffTree(copy, filter, diskMib * 2 ** 20);
    return await consume(copy.tree, report);
  } finally {
    await copy.dispose();
  }
}
