import { timeCommand } from './hyperfine.ts';
import { BenchFixture } from './fixture.ts';
import { mountBenchLayers, pooledCreates, timedCreates } from './create-samples.ts';
import { hostInfo, quantilesAgainst, type BenchOptions, type BenchReport } from './report.ts';

const RUNS = 40;
const WARMUP = 3;

/**
 * create: container create→ready (the agent answers) on pre-created shells, never used (cold) and
 * reused (warm), and with no shell ready (unpooled: crun makes the cgroups and namespaces and
 * starts the agent), against the bare namespace floor (`unshare … chroot /bin/true`) and
 * `crun run /bin/true`, all in this run on this host.
 */
export async function benchCreate(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  options.progress(`create: ${RUNS} sandboxes with no pre-created shell (unpooled)`);
  const unpooled = await timedCreates(fixture.platform, RUNS + WARMUP, (sandbox) => sandbox.close());
  options.progress('create: baseline unshare … chroot /bin/true');
  const unshare = await timeCommand(
    `unshare --fork --pid --mount --net --uts --ipc chroot ${fixture.rootfs} /bin/true`,
    RUNS,
  );
  options.progress('create: baseline crun run /bin/true');
  const crunRun = await timeCommand(
    `${fixture.crunPrefix} run --bundle ${fixture.bundle} ${fixture.containerId('create')}`,
    RUNS,
  );
  await using pooled = await BenchFixture.create({ warmPool: { latency: RUNS + WARMUP } }, 'pooled');
  await mountBenchLayers(pooled.platform);
  options.progress(
    `create: ${RUNS} sandboxes on never-used pre-created shells (cold), then on reused ones (warm)`,
  );
  const { cold, warm } = await pooledCreates(pooled.platform, RUNS + WARMUP);
  const baselines = { unshare, crun_run: crunRun };
  const measured = (samples: number[]): number[] => samples.slice(WARMUP);
  return {
    bench: 'create',
    host: hostInfo(),
    metrics: {
      ...quantilesAgainst('cold_create', measured(cold), baselines),
      ...quantilesAgainst('warm_create', measured(warm), baselines),
      ...quantilesAgainst('unpooled_create', measured(unpooled), baselines),
    },
  };
}
