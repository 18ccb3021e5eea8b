import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { openHandlesUnder } from './open-handles.ts';
import {
  hostDebianMirrorRules,
  type NetworkRuleBook,
  type SandboxSpec,
  type WarmPoolPolicy,
} from '../../src/backends/index.ts';
import { newSandboxId } from '../../src/common/index.ts';
import {
  LayerStore,
  Platform,
  defaultDataDir,
  defaultStoreDir,
  type LocalPlatform,
} from '../../src/platform/index.ts';
import type { SandboxAction, Task } from '../../src/env/index.ts';
import { evaluate, oracleAgent, scriptedAgent, type EpisodeReport } from '../../src/rollout/index.ts';

/** Each test file's platform has a data folder of its own below this; the layer store is shared. */
export const TEST_DATA_ROOT = join(defaultDataDir(), 'tests');

/** The store `sandgym setup` filled (npm test runs it first). */
export const STORE_DIR = defaultStoreDir(defaultDataDir());

/** An embedded platform in a fresh data folder; dispose it to destroy its sandboxes and the folder. */
export interface TestPlatform extends AsyncDisposable {
  platform: LocalPlatform;
  dataDir: string;
}

/** Options for {@link createTestPlatform}. */
export interface TestPlatformOptions {
  /** A store of the test's own, seeded with busybox:latest, for tests that write layers. */
  privateStore?: boolean;
  /** More environments to copy into the private store (debian:bookworm, say). */
  seed?: string[];
  /** The node id its sandbox ids carry (default `local`). */
  nodeId?: string;
  /** Warm shells to keep ready (see LocalPlatformOptions.warmPool). */
  warmPool?: WarmPoolPolicy;
  /** The node's named network rules. */
  networkRules?: NetworkRuleBook;
  /** Control plane endpoints no sandbox reaches (see LocalPlatformOptions.controlPlane). */
  controlPlane?: string[];
  /** The cap on each sandbox's trajectory log. */
  trajectoryCapBytes?: number;
  /** The project its sandboxes, environments and layers belong to (default `default`). */
  project?: string;
  /** The idle TTL of sandboxes outside a run (see LocalPlatformOptions.defaultIdleTtlMs). */
  defaultIdleTtlMs?: number;
  /** How long fresh layers are out of layer gc's reach (see LocalPlatformOptions). */
  freshLayerHoldMs?: number;
  /** How long an ended sandbox's trajectory log is kept (see LocalPlatformOptions). */
  trajectoryRetentionMs?: number;
}

export async function createTestPlatform(
  name: string,
  options: TestPlatformOptions = {},
): Promise<TestPlatform> {
  const dataDir = join(TEST_DATA_ROOT, `${name}-${randomBytes(4).toString('hex')}`);
  const storeDir = options.privateStore ? join(dataDir, 'store') : STORE_DIR;
  if (options.privateStore) {
    const store = await LayerStore.open(storeDir);
    const shared = await LayerStore.open(STORE_DIR);
    for (const ref of ['busybox:latest', ...(options.seed ?? [])]) await store.importEnvironment(shared, ref);
  }
  const platform = await Platform.local({
    dataDir,
    storeDir,
    ...(options.nodeId ? { nodeId: options.nodeId } : {}),
    ...(options.warmPool ? { warmPool: options.warmPool } : {}),
    ...(options.networkRules ? { networkRules: options.networkRules } : {}),
    ...(options.controlPlane ? { controlPlane: options.controlPlane } : {}),
    ...(options.trajectoryCapBytes ? { trajectoryCapBytes: options.trajectoryCapBytes } : {}),
    ...(options.project ? { project: options.project } : {}),
    ...(options.freshLayerHoldMs === undefined ? {} : { freshLayerHoldMs: options.freshLayerHoldMs }),
    ...(options.trajectoryRetentionMs ? { trajectoryRetentionMs: options.trajectoryRetentionMs } : {}),
    ...(options.defaultIdleTtlMs ? { defaultIdleTtlMs: options.defaultIdleTtlMs } : {}),
  });
  return {
    platform,
    dataDir,
    async [Symbol.asyncDispose]() {
      try {
        await platform.close();
        // a closed platform holds nothing of its data folder open: no log, pin file or channel
        const held = openHandlesUnder(dataDir);
        if (held.length) throw new Error(`platform ${name} still holds open after close: ${held.join(', ')}`);
      } finally {
        await rm(dataDir, { recursive: true, force: true });
      }
    },
  };
}

/** A backend sandbox spec on busybox:latest from the shared store, for the backend conformance suites. */
export async function busyboxSpecFactory(): Promise<() => SandboxSpec> {
  const store = await LayerStore.open(STORE_DIR);
  const layers = await store.layerImages(await store.getEnvironment('busybox:latest'));
  return () => ({
    id: newSandboxId('local'),
    layers,
    env: {},
    workdir: '/',
    resources: { cpu: 1, memoryMib: 128, pids: 128, outputCapBytes: 1 << 20, diskMib: 1024 },
    qos: 'latency' as const,
    labels: {},
    network: [],
  });
}

/** A rule book that lets builds reach Debian's package mirror (see hostDebianMirrorRules). */
export function debianMirrorRules(): Promise<NetworkRuleBook> {
  return hostDebianMirrorRules();
}

/**
 * Plays one episode of `task` on `platform` with a scripted agent (or the task's oracle) and
 * returns its report, as `sandgym eval` would grade it.
 */
export async function playEpisode(
  platform: LocalPlatform,
  task: Task,
  actions: SandboxAction[] | 'oracle',
): Promise<EpisodeReport> {
  const agent = actions === 'oracle' ? oracleAgent : () => scriptedAgent(actions);
  const [report] = await evaluate(platform, [task], agent, { concurrency: 1 });
  if (!report) throw new Error(`no report for task ${task.id}`);
  return report;
}

/**
 * A platform whose data folder is on a tmpfs of `sizeMib`, for tests of a node whose disk fills;
 * dispose it to close the platform and unmount the volume.
 */
export async function smallVolumePlatform(
  name: string,
  sizeMib: number,
): Promise<AsyncDisposable & { platform: LocalPlatform; mountPoint: string }> {
  const mountPoint = join(TEST_DATA_ROOT, `${name}-${process.pid}`);
  await mkdir(mountPoint, { recursive: true });
  const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeMib}m`, 'tmpfs', mountPoint]);
  if (mounted.status !== 0)
    throw new Error(`cannot mount a tmpfs at ${mountPoint}: ${String(mounted.stderr)}`);
  const platform = await Platform.local({
    dataDir: join(mountPoint, 'data'),
    storeDir: STORE_DIR,
    nodeId: name,
  });
  return {
    platform,
    mountPoint,
    async [Symbol.asyncDispose]() {
      await platform.close();
      // the volume's loop device lets go of its image a moment after the volume is unmounted
      for (let attempt = 0; attempt < 50 && spawnSync('umount', [mountPoint]).status !== 0; attempt++)
        await new Promise((resolve) => setTimeout(resolve, 100));
      await rm(mountPoint, { recursive: true, force: true });
    },
  };
}
