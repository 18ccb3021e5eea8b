/**
 * Runs one task per key at a time: callers asking for a key whose task is running share its
 * promise instead of starting another (two mounts of one layer, two copies of one file).
 */
export class SingleFlight<T> {
  private readonly running = new Map<string, Promise<T>>();

  run(key: string, task: () => Promise<T>): Promise<T> {
    const existing = this.running.get(key);
    if (existing) return existing;
    const started = task().finally(() => this.running.delete(key));
    this.running.set(key, started);
    return started;
  }
}
