import { timeCommand } from './hyperfine.ts';
import { BenchFixture } from './fixture.ts';
import { hostInfo, quantilesAgainst, type BenchOptions, type BenchReport } from './report.ts';

const RUNS = 40;
const WARMUP = 3;

/**
 * Creates served by a warm pool (a shell already running; its root is swapped for the layers),
 * each closed before the next, with the pool refilled in between so every one is warm.
 */
async function warmCreates(): Promise<number[]> {
  await using fixture = await BenchFixture.create({ warmPool: { latency: 4 } }, 'warm');
  const samples: number[] = [];
  for (let i = 0; i < RUNS + WARMUP; i++) {
    await fixture.platform.warmPool.filled();
    const started = performance.now();
    const sandbox = await fixture.platform.createSandbox({ environment: 'busybox:latest' });
    const elapsed = performance.now() - started;
    await sandbox.close();
    if (i >= WARMUP) samples.push(elapsed);
  }
  return samples;
}

/**
 * create: container create→ready (cold, and from a warm pool) (the agent answers), against the bare namespace floor
 * (`unshare … chroot /bin/true`) and `crun run /bin/true`, all in this run on this host.
 */
export async function benchCreate(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  const samples: number[] = [];
  options.progress(`create: ${RUNS} sandgym sandboxes (busybox:latest)`);
  for (let i = 0; i < RUNS + WARMUP; i++) {
    const started = performance.now();
    const sandbox = await fixture.platform.createSandbox({ environment: 'busybox:latest' });
    const elapsed = performance.now() - started;
    await sandbox.close();
    if (i >= WARMUP) samples.push(elapsed);
  }
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
  options.progress(`create: ${RUNS} sandboxes taken from a warm pool`);
  const warm = await warmCreates();
  return {
    bench: 'create',
    host: hostInfo(),
    metrics: {
      ...quantilesAgainst('create', samples, { unshare, crun_run: crunRun }),
      ...quantilesAgainst('warm_create', warm, { unshare, crun_run: crunRun }),
    },
  };
}
