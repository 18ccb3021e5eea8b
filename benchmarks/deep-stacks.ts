import { randomBytes } from 'node:crypto';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import {
  LayerStore,
  Platform,
  defaultDataDir,
  defaultStoreDir,
  type LocalPlatform,
} from '../src/platform/index.ts';

/**
 * Create latency over layer stacks as deep as Dockerfiles make them: busybox and 2, 39 or 199
 * one-file layers over it (3, 40 and 200 layers), each create timed until the agent answers, in
 * a data folder of its own; then creates of the 3-layer stack from a warm pool.
 *
 *   npx tsc -p tsconfig.build.json && node dist/benchmarks/deep-stacks.js [RUNS]
 *
 * Prints one line per case: the median and every sample in ms, or the error the create met.
 * The first create of a deep stack makes its flattened base (the `first` column).
 */
const DEPTHS = [3, 40, 200];
const RUNS = Number(process.argv[2] ?? 7);

function median(samples: number[]): number {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}

/** How long a create took, closing the sandbox after the clock stopped. */
async function timedCreate(platform: LocalPlatform, environment: string): Promise<number> {
  const started = performance.now();
  const sandbox = await platform.createSandbox({ environment });
  const ms = performance.now() - started;
  await sandbox.close();
  return ms;
}

const dataDir = join(defaultDataDir(), 'bench', `deep-stacks-${randomBytes(4).toString('hex')}`);
const storeDir = join(dataDir, 'store');
const store = await LayerStore.open(storeDir);
await store.importEnvironment(await LayerStore.open(defaultStoreDir(defaultDataDir())), 'busybox:latest');
const base = await store.getEnvironment('busybox:latest');
const layers = [...base.layers];
for (let i = layers.length; i < Math.max(...DEPTHS); i++) {
  const tree = join(dataDir, 'trees', String(i));
  await mkdir(join(tree, 'deep'), { recursive: true });
  await writeFile(join(tree, 'deep', String(i)), `${i}\n`);
  layers.push((await store.addLayerFromDirectory(tree, `deep-stacks bench layer ${i}`)).digest);
  if (DEPTHS.includes(layers.length))
    await store.putEnvironment({
      name: 'deep',
      version: String(layers.length),
      layers: [...layers],
      config: base.config,
    });
}

try {
  const platform = await Platform.local({ dataDir, storeDir });
  try {
    for (const depth of DEPTHS) {
      const samples: number[] = [];
      try {
        for (let run = 0; run < RUNS + 1; run++) {
          samples.push(await timedCreate(platform, `deep:${depth}`));
        }
        const [first, ...rest] = samples.map(Math.round);
        console.log(
          `cold ${depth} layers: median ${median(rest)} ms, first ${first} ms, samples ${rest.join(' ')}`,
        );
      } catch (error) {
        console.log(
          `cold ${depth} layers: failed: ${error instanceof Error ? error.message : String(error)}`,
        );
      }
    }
  } finally {
    await platform.close();
  }
  const pooled = await Platform.local({ dataDir, storeDir, warmPool: { latency: 1 } });
  try {
    const samples: number[] = [];
    for (let run = 0; run < RUNS + 1; run++) {
      await pooled.warmPool.filled();
      samples.push(await timedCreate(pooled, 'deep:3'));
    }
    const [, ...rest] = samples.map(Math.round);
    console.log(`pooled 3 layers: median ${median(rest)} ms, samples ${rest.join(' ')}`);
  } finally {
    await pooled.close();
  }
} finally {
  await rm(dataDir, { recursive: true, force: true });
}
