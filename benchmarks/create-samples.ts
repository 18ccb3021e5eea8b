import type { LocalPlatform, Sandbox } from '../src/platform/index.ts';

const REQUEST = { environment: 'busybox:latest' };

/** create→ready times of `count` sandboxes, one at a time; `after` gets each (close it, or keep it live). */
export async function timedCreates(
  platform: LocalPlatform,
  count: number,
  after: (sandbox: Sandbox) => Promise<void>,
): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    const sandbox = await platform.createSandbox(REQUEST);
    samples.push(performance.now() - started);
    await after(sandbox);
  }
  return samples;
}

/**
 * Creates on a platform's pre-created shells (cgroups, namespaces and agent made ahead, nobody's):
 * `cold` takes shells that never served anyone, each sandbox kept live until all are timed so
 * that none comes back; `warm` closes each before the next, so every create takes a shell that
 * was scrubbed after a tenant. The pool must be able to hold `count` shells.
 */
export async function pooledCreates(
  platform: LocalPlatform,
  count: number,
): Promise<{ cold: number[]; warm: number[] }> {
  await platform.warmPool.filled();
  const live: Sandbox[] = [];
  let cold: number[];
  try {
    cold = await timedCreates(platform, count, (sandbox) => {
      live.push(sandbox);
      return Promise.resolve();
    });
  } finally {
    await Promise.all(live.map((sandbox) => sandbox.close()));
  }
  await platform.warmPool.filled();
  const warm = await timedCreates(platform, count, async (sandbox) => {
    await sandbox.close();
    await platform.warmPool.filled();
  });
  return { cold, warm };
}

/** Mounts the benchmark environment's layers (an image pull's business, not a create's) on the platform's node. */
export async function mountBenchLayers(platform: LocalPlatform): Promise<void> {
  await (await platform.createSandbox(REQUEST)).close();
}
