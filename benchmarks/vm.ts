import { rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { VmBackend, accelerator, type SandboxSpec, type VmSandbox } from '../src/backends/index.ts';
import { newSandboxId } from '../src/common/index.ts';
import { LayerStore, defaultDataDir, defaultStoreDir } from '../src/platform/index.ts';
import { compared, hostInfo, quantile, type BenchOptions, type BenchReport, type Metric } from './report.ts';

const BOOTS = Number(process.env['SANDGYM_BENCH_VM_BOOTS'] ?? 5);
const FORKS = 4;

/**
 * vm: microVMs on busybox:latest. Cold boot to agent-ready, against a restore from a checkpoint
 * to agent-ready (the goal: at most 0.3 of a cold boot here, under TCG; on KVM, at most 150 ms);
 * the checkpoint itself; a fork of 4 from one checkpoint; and host memory (QEMU's RSS) per idle VM.
 */
export async function benchVm(options: BenchOptions): Promise<BenchReport> {
  const base = defaultDataDir();
  const dataDir = resolve(base, `bench-vm-${process.pid}`);
  const storeDir = defaultStoreDir(base);
  const store = await LayerStore.open(storeDir);
  const layers = await store.layerImages(await store.getEnvironment('busybox:latest'));
  const spec = (): SandboxSpec => ({
    id: newSandboxId('bench'),
    layers,
    env: {},
    workdir: '/',
    resources: { cpu: 1, memoryMib: 256, pids: 256, outputCapBytes: 1 << 20, diskMib: 1024 },
    qos: 'latency',
    labels: {},
    network: [],
  });
  const backend = await VmBackend.create({ dataDir, guestDir: join(storeDir, 'guest') });
  const live: VmSandbox[] = [];
  try {
    const accel = await accelerator();
    options.progress(`vm: ${BOOTS} cold boots to agent-ready (${accel})`);
    const boots: number[] = [];
    for (let i = 0; i < BOOTS; i++) {
      const started = performance.now();
      live.push(await backend.create(spec()));
      boots.push(performance.now() - started);
    }
    await new Promise((resolveIdle) => setTimeout(resolveIdle, 2000)); // settle: idle, not booting
    const rss = await Promise.all(live.map(async (vm) => (await vm.stats()).memoryBytes / 2 ** 20));
    options.progress('vm: checkpoint, then restores to agent-ready');
    const origin = live[0]!;
    await origin.exec(['sh', '-c', 'echo checkpointed > /root/mark']);
    const checkpointStarted = performance.now();
    const snapshot = await origin.snapshot();
    const checkpointMs = performance.now() - checkpointStarted;
    for (const vm of live.splice(0)) await vm.close();
    const restores: number[] = [];
    for (let i = 0; i < BOOTS; i++) {
      const started = performance.now();
      const restored = await backend.restoreAsNew(snapshot, spec());
      restores.push(performance.now() - started);
      const mark = (await restored.readFile('/root/mark')).toString();
      if (mark !== 'checkpointed\n')
        throw new Error(`a restore lost the checkpoint's file: ${JSON.stringify(mark)}`);
      await restored.close();
    }
    options.progress(`vm: fork of ${FORKS}`);
    const forkStarted = performance.now();
    live.push(...(await backend.fork(snapshot, Array.from({ length: FORKS }, spec))));
    const forkMs = performance.now() - forkStarted;
    await backend.dropSnapshot(snapshot);
    const bootP50 = quantile(boots, 0.5);
    const metrics: Record<string, Metric> = {
      restore_p50_ms_vs_cold_boot: compared(quantile(restores, 0.5), bootP50),
      restore_p99_ms_vs_cold_boot: compared(quantile(restores, 0.99), quantile(boots, 0.99)),
      checkpoint_ms_vs_cold_boot: compared(checkpointMs, bootP50),
      [`fork_${FORKS}_ms_vs_${FORKS}_cold_boots`]: compared(forkMs, bootP50 * FORKS),
      idle_vm_rss_mib: { value: Math.round(quantile(rss, 0.5) * 10) / 10, unit: 'MiB' },
      cold_boot_p50_ms: { value: Math.round(bootP50), unit: `ms (${accel})` },
    };
    return { bench: 'vm', host: hostInfo(), metrics };
  } finally {
    await Promise.all(live.map((vm) => vm.close().catch(() => undefined)));
    await backend.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}
