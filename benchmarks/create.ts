import { timeCommand } from './hyperfine.ts';
import { BenchFixture } from './fixture.ts';
import { hostInfo, quantilesAgainst, type BenchOptions, type BenchReport } from './report.ts';
import type { LocalPlatform, Sandbox } from '../src/platform/index.ts';

const RUNS = 40;
const WARMUP = 3;
const REQUEST = { environment: 'busybox:latest' };

/** create→ready of one sandbox at a time; `after` gets each (close it, or keep it live). */
async function timedCreates(
  platform: LocalPlatform,
  after: (sandbox: Sandbox) => Promise<void>,
): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < RUNS + WARMUP; i++) {
    const started = performance.now();
    const sandbox = await platform.createSandbox(REQUEST);
    const elapsed = performance.now() - started;
    await after(sandbox);
    if (i >= WARMUP) samples.push(elapsed);
  }
  return samples;
}

/**
 * Creates on a node's pre-created shells (cgroups, namespaces and agent made ahead, no tenant's):
 * `cold` takes a shell that never served anyone, each sandbox kept live so that no shell comes
 * back; `warm` closes each before the next, so every create takes a shell scrubbed after a tenant.
 */
async function pooledCreates(options: BenchOptions): Promise<{ cold: number[]; warm: number[] }> {
  await using fixture = await BenchFixture.create({ warmPool: { latency: RUNS + WARMUP } }, 'pooled');
  const { platform } = fixture;
  // the layer's first mount on the node (and its digest check) is an image pull's business, not a create's
  await (await platform.createSandbox(REQUEST)).close();
  await platform.warmPool.filled();
  options.progress(`create: ${RUNS} sandboxes on never-used pre-created shells (cold)`);
  const live: Sandbox[] = [];
  let cold: number[];
  try {
    cold = await timedCreates(platform, (sandbox) => {
      live.push(sandbox);
      return Promise.resolve();
    });
  } finally {
    await Promise.all(live.map((sandbox) => sandbox.close()));
  }
  options.progress(`create: ${RUNS} sandboxes on shells scrubbed after a tenant (warm)`);
  const warm = await timedCreates(platform, async (sandbox) => {
    await sandbox.close();
    await platform.warmPool.filled();
  });
  return { cold, warm };
}

/**
 * create: container create→ready (the agent answers) on pre-created shells, never used (cold) and
 * reused (warm), and with no shell ready (unpooled: crun makes the cgroups and namespaces and
 * starts the agent), against the bare namespace floor (`unshare … chroot /bin/true`) and
 * `crun run /bin/true`, all in this run on this host.
 */
export async function benchCreate(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  options.progress(`create: ${RUNS} sandboxes with no pre-created shell (unpooled)`);
  const unpooled = await timedCreates(fixture.platform, (sandbox) => sandbox.close());
  options.progress('create: baseline unshare … chroot /bin/true');
  const unshare = await timeCommand(
    `unshare --fork --pid --mount --net --uts --ipc chroot ${fixture.rootfs} /bin/true`,
    RUNS,
  );
  options.progress('create: baseline crun run /bin/true');
  const crunRun = await timeCommand(
    `${fixture.crunPrefix} run --bundle ${fixture.bundle} sandgym-bench-create`,
    RUNS,
  );
  const { cold, warm } = await pooledCreates(options);
  const baselines = { unshare, crun_run: crunRun };
  return {
    bench: 'create',
    host: hostInfo(),
    metrics: {
      ...quantilesAgainst('cold_create', cold, baselines),
      ...quantilesAgainst('warm_create', warm, baselines),
      ...quantilesAgainst('unpooled_create', unpooled, baselines),
    },
  };
}
