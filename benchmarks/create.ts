import { timeCommand } from './hyperfine.ts';
import { BenchFixture } from './fixture.ts';
import { compared, hostInfo, quantile, type BenchOptions, type BenchReport } from './report.ts';

const RUNS = 40;
const WARMUP = 3;

/**
 * create: container create→ready (the agent answers), against the bare namespace floor
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
  const p50 = quantile(samples, 0.5);
  const p99 = quantile(samples, 0.99);
  return {
    bench: 'create',
    host: hostInfo(),
    metrics: {
      create_p50_ms_vs_unshare: compared(p50, quantile(unshare, 0.5)),
      create_p99_ms_vs_unshare: compared(p99, quantile(unshare, 0.99)),
      create_p50_ms_vs_crun_run: compared(p50, quantile(crunRun, 0.5)),
      create_p99_ms_vs_crun_run: compared(p99, quantile(crunRun, 0.99)),
    },
  };
}
