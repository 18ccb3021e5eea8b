import { randomBytes } from 'node:crypto';
import { readFile, readdir, mkdir, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { runProgram, type LoadMode } from '../src/backends/index.ts';
import { LayerStore, Platform, defaultDataDir, defaultStoreDir } from '../src/platform/index.ts';
import { compared, hostInfo, type BenchOptions, type BenchReport, type Metric } from './report.ts';
import { ShapedStore } from './shaped-store.ts';

/** The shape of the burst; each can be set through the environment for a bigger machine. */
const SANDBOXES = Number(process.env['SANDGYM_BENCH_LAYERS_SANDBOXES'] ?? 32);
const ENVIRONMENTS = Number(process.env['SANDGYM_BENCH_LAYERS_ENVS'] ?? 3);
const FILES_PER_ENV = 512;
const FILE_BYTES = 400 * 1024;
/** Share of an environment's files a sandbox's workload reads (DSec saw 4-13% of image bytes read). */
const READ_FRACTION = 0.08;
const LINK_MBIT = Number(process.env['SANDGYM_BENCH_LAYERS_MBIT'] ?? 400);
const MODES: LoadMode[] = ['ondemand', 'eager', 'tar'];

interface ModeResult {
  completionMs: number;
  storeReadBytes: number;
  diskWriteBytes: number;
  peakMemoryBytes: number;
}

/** Sectors written to every real disk so far (loop and RAM devices left out), in bytes. */
async function diskWrittenBytes(): Promise<number> {
  const disks = (await readdir('/sys/block')).filter((d) => !/^(loop|ram|zram)/.test(d));
  let sectors = 0;
  for (const line of (await readFile('/proc/diskstats', 'utf8')).split('\n')) {
    const fields = line.trim().split(/\s+/);
    if (disks.includes(fields[2] ?? '')) sectors += Number(fields[9] ?? 0);
  }
  return sectors * 512;
}

async function memoryInUseBytes(): Promise<number> {
  const text = await readFile('/proc/meminfo', 'utf8');
  const kib = (key: string): number => Number(new RegExp(`^${key}:\\s+(\\d+)`, 'm').exec(text)?.[1] ?? 0);
  return (kib('MemTotal') - kib('MemAvailable')) * 1024;
}

/** Environments of a few hundred MB of files each, over the busybox base; returns what each workload reads. */
async function buildEnvironments(
  origin: LayerStore,
  scratch: string,
  progress: (m: string) => void,
): Promise<string[][]> {
  await origin.importEnvironment(await LayerStore.open(defaultStoreDir(defaultDataDir())), 'busybox:latest');
  const base = await origin.getEnvironment('busybox:latest');
  const workloads: string[][] = [];
  for (let e = 0; e < ENVIRONMENTS; e++) {
    progress(
      `layers: building environment ${e + 1}/${ENVIRONMENTS} (${(FILES_PER_ENV * FILE_BYTES) / 2 ** 20} MiB)`,
    );
    const dir = join(scratch, `env-${e}`);
    await mkdir(join(dir, 'data'), { recursive: true });
    const names: string[] = [];
    for (let f = 0; f < FILES_PER_ENV; f++) {
      const name = `/data/file-${e}-${String(f).padStart(4, '0')}`;
      // base64 of random bytes: compresses about as well as typical image content
      await writeFile(join(dir, name), randomBytes((FILE_BYTES * 3) / 4).toString('base64'));
      names.push(name);
    }
    const layer = await origin.addLayerFromDirectory(dir, `bench environment ${e}`);
    await rm(dir, { recursive: true, force: true });
    await origin.putEnvironment({
      name: `bench-${e}`,
      version: '1',
      layers: [...base.layers, layer.digest],
      config: {},
    });
    const step = Math.round(1 / READ_FRACTION);
    workloads.push(names.filter((_, i) => i % step === 0));
  }
  return workloads;
}

async function dropCaches(): Promise<void> {
  await runProgram('sync', []);
  await writeFile('/proc/sys/vm/drop_caches', '3');
}

async function runMode(
  mode: LoadMode,
  store: ShapedStore,
  root: string,
  workloads: string[][],
): Promise<ModeResult> {
  await store.mount();
  await dropCaches();
  const platform = await Platform.local({
    dataDir: join(root, `node-${mode}`),
    storeDir: store.mountPoint,
    loadMode: mode,
    verifyLayers: 'size',
  });
  try {
    const [readBefore, writtenBefore, memoryBefore] = await Promise.all([
      store.bytesSent(),
      diskWrittenBytes(),
      memoryInUseBytes(),
    ]);
    let peak = memoryBefore;
    const sampler = setInterval(() => void memoryInUseBytes().then((m) => (peak = Math.max(peak, m))), 50);
    const started = performance.now();
    const sandboxes = await Promise.all(
      Array.from({ length: SANDBOXES }, async (_, i) => {
        const sandbox = await platform.createSandbox({
          environment: `bench-${i % ENVIRONMENTS}:1`,
          resources: { memoryMib: 256 },
        });
        const files = workloads[i % ENVIRONMENTS] ?? [];
        const result = await sandbox.exec(['sh', '-c', `cat ${files.join(' ')} > /dev/null`]);
        if (result.exitCode !== 0) throw new Error(`workload failed in ${sandbox.id}: ${result.stderr}`);
        return sandbox;
      }),
    );
    const completionMs = performance.now() - started;
    clearInterval(sampler);
    await runProgram('sync', []);
    const [readAfter, writtenAfter] = await Promise.all([store.bytesSent(), diskWrittenBytes()]);
    await Promise.all(sandboxes.map((s) => s.close()));
    return {
      completionMs,
      storeReadBytes: readAfter - readBefore,
      diskWriteBytes: writtenAfter - writtenBefore,
      peakMemoryBytes: peak - memoryBefore,
    };
  } finally {
    await platform.close();
  }
}

/**
 * layers: the DSec ablation on our system. A burst of sandboxes over several environments whose
 * workloads read a small share of their files, with the store behind a shaped network link, in
 * each loading mode: ondemand (mount from the store), eager (copy layers first) and tar
 * (unpack a tar.gz per sandbox).
 */
export async function benchLayers(options: BenchOptions): Promise<BenchReport> {
  const root = resolve(defaultDataDir(), `bench-layers-${process.pid}`);
  await mkdir(root, { recursive: true });
  try {
    const origin = await LayerStore.open(join(root, 'origin'));
    const workloads = await buildEnvironments(origin, join(root, 'scratch'), (message) =>
      options.progress(message),
    );
    options.progress('layers: making each layer\'s tar.gz for the tar mode (the "registry" copy)');
    const maker = await Platform.local({
      dataDir: join(root, 'node-prepare'),
      storeDir: origin.root,
      loadMode: 'tar',
    });
    try {
      for (let e = 0; e < ENVIRONMENTS; e++)
        await (await maker.createSandbox({ environment: `bench-${e}:1` })).close();
    } finally {
      await maker.close();
    }
    await using store = await ShapedStore.start(origin.root, join(root, 'link'), LINK_MBIT);
    const results = {} as Record<LoadMode, ModeResult>;
    for (const mode of MODES) {
      options.progress(
        `layers: ${SANDBOXES} sandboxes over ${ENVIRONMENTS} environments, ${mode}, store link ${LINK_MBIT} Mbit/s`,
      );
      results[mode] = await runMode(mode, store, root, workloads);
    }
    const metrics: Record<string, Metric> = {};
    for (const mode of MODES) {
      const r = results[mode];
      metrics[`${mode}_completion_ms`] = { value: Math.round(r.completionMs), unit: 'ms' };
      metrics[`${mode}_store_read_mib`] = { value: Math.round(r.storeReadBytes / 2 ** 20), unit: 'MiB' };
      metrics[`${mode}_disk_write_mib`] = { value: Math.round(r.diskWriteBytes / 2 ** 20), unit: 'MiB' };
      metrics[`${mode}_peak_memory_mib`] = { value: Math.round(r.peakMemoryBytes / 2 ** 20), unit: 'MiB' };
    }
    for (const baseline of ['eager', 'tar'] as const) {
      // ratio = baseline / ondemand here: "how many times longer (or more) than on-demand"
      const b = results[baseline];
      const o = results.ondemand;
      metrics[`${baseline}_over_ondemand_completion`] = compared(b.completionMs, o.completionMs, 'ms');
      metrics[`${baseline}_over_ondemand_disk_write`] = compared(
        b.diskWriteBytes / 2 ** 20,
        o.diskWriteBytes / 2 ** 20,
        'MiB',
      );
      metrics[`${baseline}_over_ondemand_store_read`] = compared(
        b.storeReadBytes / 2 ** 20,
        o.storeReadBytes / 2 ** 20,
        'MiB',
      );
    }
    return { bench: 'layers', host: hostInfo(), metrics };
  } finally {
    await rm(root, { recursive: true, force: true });
  }
}
