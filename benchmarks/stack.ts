/** Everything one run of a benchmark starts, closed in reverse, each closer's failure ignored. */
export class Stack {
  private readonly closers: (() => Promise<unknown>)[] = [];
  add(close: () => Promise<unknown>): void {
    this.closers.push(close);
  }
  async close(): Promise<void> {
    for (const close of this.closers.reverse()) await close().catch(() => undefined);
  }
}
