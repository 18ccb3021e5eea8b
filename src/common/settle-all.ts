/**
 * Runs every teardown to the end, even when some fail, then throws one AggregateError that holds
 * each failure (conventions: teardown collects errors rather than stopping at the first).
 */
export async function settleAll(work: Promise<unknown>[], failureMessage: string): Promise<void> {
  const results = await Promise.allSettled(work);
  const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed.length)
    throw new AggregateError(
      failed.map((f): unknown => f.reason),
      failureMessage,
    );
}
