import { readFileSync } from 'node:fs';
import { ensureSwapFile, removeSwapFile } from '../src/backends/index.ts';
import { BenchFixture } from './fixture.ts';
import { hostInfo, quantile, type BenchOptions, type BenchReport } from './report.ts';
import type { Sandbox } from '../src/platform/index.ts';

const SANDBOXES = Number(process.env['SANDGYM_BENCH_HIBERNATE'] ?? 1_000);
const HELD_MB = 2;
const CONCURRENCY = 16;
const RESUME_SAMPLES = 100;
const REQUEST = { environment: 'busybox:latest', resources: { memoryMib: 64 } };

async function forAll(sandboxes: Sandbox[], work: (sandbox: Sandbox) => Promise<unknown>): Promise<number> {
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < sandboxes.length) await work(sandboxes[next++]!);
    }),
  );
  return performance.now() - started;
}

function swapUsedMib(): number {
  return readFileSync('/proc/swaps', 'utf8')
    .split('\n')
    .slice(1)
    .filter(Boolean)
    .reduce((sum, line) => sum + Number(line.split(/\s+/)[3] ?? 0) / 1024, 0);
}

/**
 * hibernate: 1,000 idle sandboxes, each with a process holding 2 MB of anonymous memory, on a node
 * with a swap file (made for the run, removed after). Times freezing them all, then hibernating
 * them all (by memory image where CRIU works, else freeze plus pushing their memory out), the
 * share of their memory that left RAM (all of it, and the user part: without the kernel memory
 * charged to them, which swap cannot take), and the first step of a hibernated sandbox (resume
 * included).
 */
export async function benchHibernate(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  const swapFile = `${fixture.dir}.swapfile`;
  const swapMib = Math.max(256, SANDBOXES * HELD_MB * 2);
  options.progress(`hibernate: a ${swapMib} MiB swap file`);
  await ensureSwapFile(swapFile, swapMib);
  const sandboxes: Sandbox[] = [];
  try {
    options.progress(`hibernate: ${SANDBOXES} sandboxes, each holding ${HELD_MB} MB`);
    for (let i = 0; i < SANDBOXES; i++) sandboxes.push(await fixture.platform.createSandbox(REQUEST));
    await forAll(sandboxes, async (sandbox) => {
      // in the background, so the sandbox is idle (no request in flight) as a preempted one is;
      // the trailing use keeps the shell (and its variable) alive: sh would exec a last `sleep`
      await sandbox.exec([
        'sh',
        '-c',
        `sh -c 'p=$(head -c ${HELD_MB * 1000000} /dev/zero | tr "\\0" a); touch /tmp/held; sleep 1000000; echo \${#p}' >/dev/null 2>&1 &`,
      ]);
      while ((await sandbox.exec(['test', '-e', '/tmp/held'])).exitCode !== 0) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    });
    /** Their memory, and of it what the kernel holds for them (which no swap can take). */
    const used = async (): Promise<{ total: number; kernel: number }> => {
      const sum = { total: 0, kernel: 0 };
      await forAll(sandboxes, async (s) => {
        const { memoryBytes, kernelMemoryBytes } = await s.stats();
        sum.total += memoryBytes;
        sum.kernel += kernelMemoryBytes;
      });
      return sum;
    };
    const before = await used();
    options.progress('hibernate: freezing all, then thawing');
    const freezeMs = await forAll(sandboxes, (s) => s.pause());
    await forAll(sandboxes, (s) => s.resume());
    options.progress('hibernate: hibernating all');
    const swapBefore = swapUsedMib();
    let reported = 0;
    const hibernateMs = await forAll(sandboxes, async (s) => {
      const { freedBytes } = await s.hibernate();
      reported += freedBytes;
    });
    const after = await used(); // stats do not wake a hibernated sandbox
    const swapped = swapUsedMib() - swapBefore;
    options.progress(`hibernate: first step of ${RESUME_SAMPLES} hibernated sandboxes`);
    const firstStep: number[] = [];
    for (const sandbox of sandboxes.slice(0, RESUME_SAMPLES)) {
      const started = performance.now();
      await sandbox.exec(['true']);
      firstStep.push(performance.now() - started);
    }
    const round = (n: number): number => Math.round(n * 10) / 10;
    const share = (part: number, whole: number): number => Math.round((part / whole) * 1000) / 1000;
    return {
      bench: 'hibernate',
      host: hostInfo(),
      metrics: {
        sandboxes: { value: SANDBOXES, unit: 'sandboxes' },
        freeze_all_ms: { value: round(freezeMs), unit: 'ms' },
        hibernate_all_ms: { value: round(hibernateMs), unit: 'ms' },
        memory_before_mib: { value: round(before.total / 2 ** 20), unit: 'MiB' },
        kernel_memory_before_mib: { value: round(before.kernel / 2 ** 20), unit: 'MiB' },
        memory_freed_share: { value: share(before.total - after.total, before.total), unit: 'fraction' },
        user_memory_freed_share: {
          value: share(
            before.total - before.kernel - (after.total - after.kernel),
            before.total - before.kernel,
          ),
          unit: 'fraction',
        },
        reported_freed_mib: { value: round(reported / 2 ** 20), unit: 'MiB' },
        swapped_mib: { value: round(swapped), unit: 'MiB' },
        first_step_after_hibernate_p50_ms: { value: round(quantile(firstStep, 0.5)), unit: 'ms' },
        first_step_after_hibernate_p99_ms: { value: round(quantile(firstStep, 0.99)), unit: 'ms' },
      },
    };
  } finally {
    options.progress(`hibernate: closing ${sandboxes.length} sandboxes`);
    const closed = await Promise.allSettled(sandboxes.map((s) => s.close()));
    // the swap file goes whatever happened: the host as the run found it
    await removeSwapFile(swapFile);
    const failed = closed.filter((c): c is PromiseRejectedResult => c.status === 'rejected');
    if (failed.length > 0)
      options.progress(
        `hibernate: ${failed.length} sandboxes did not close cleanly, first: ${String(failed[0]!.reason)}`,
      );
  }
}
