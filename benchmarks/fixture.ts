import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  agentBinaryPath,
  buildBusyboxRootfs,
  detectCgroupLayout,
  hostProgram,
  runProgram,
} from '../src/backends/index.ts';
import {
  Platform,
  defaultDataDir,
  defaultStoreDir,
  type LocalPlatform,
  type LocalPlatformOptions,
} from '../src/platform/index.ts';

/** crun's state folder for the baselines' containers, beside the platform's `runtime`. */
const BASELINE_RUNTIME = 'baseline-runtime';

/** Passes over the containers left after a `crun delete --force`. */
const DELETE_ATTEMPTS = 5;

/**
 * What the benchmarks share: an embedded platform in a data folder of its own (the store is the
 * usual one), a busybox root folder and an OCI bundle for the baselines.
 */
export class BenchFixture implements AsyncDisposable {
  private constructor(
    readonly platform: LocalPlatform,
    readonly dir: string,
    readonly rootfs: string,
    readonly bundle: string,
    /**
     * Prefix that runs crun the way the backend does (see agent/launch.c): fair to both sides.
     * Its state folder is the baselines' own: the platform's (`runtime`) holds its warm shells,
     * which a baseline's clean-up must never delete.
     */
    readonly crunPrefix: string,
    private readonly launcher: string,
  ) {}

  /** The same prefix on the platform's state folder, to reach its sandboxes. */
  get sandboxCrunPrefix(): string {
    return `${this.launcher} --root ${join(this.dir, 'runtime')}`;
  }

  /** `name` tells apart two fixtures of one benchmark. */
  static async create(
    options: Pick<LocalPlatformOptions, 'warmPool'> = {},
    name = '',
  ): Promise<BenchFixture> {
    const base = defaultDataDir();
    const dir = resolve(base, `bench-${process.pid}${name ? `-${name}` : ''}`);
    const platform = await Platform.local({ dataDir: dir, storeDir: defaultStoreDir(base), ...options });
    const bundle = join(dir, 'bundle');
    const rootfs = join(bundle, 'rootfs');
    await mkdir(rootfs, { recursive: true });
    await buildBusyboxRootfs(rootfs);
    await runProgram(hostProgram('crun'), ['spec', '-b', bundle]);
    const specPath = join(bundle, 'config.json');
    const spec = JSON.parse(await readFile(specPath, 'utf8')) as {
      process: { terminal: boolean; args: string[] };
    };
    spec.process.terminal = false;
    spec.process.args = ['/bin/true'];
    await writeFile(specPath, JSON.stringify(spec));
    const layout = await detectCgroupLayout();
    const umount = layout.kind === 'v1' && layout.unified ? `--umount ${layout.unified} ` : '';
    const launcher = `${agentBinaryPath()} launch ${umount}-- ${hostProgram('crun')}`;
    return new BenchFixture(
      platform,
      dir,
      rootfs,
      bundle,
      `${launcher} --root ${join(dir, BASELINE_RUNTIME)}`,
      launcher,
    );
  }

  /**
   * A container name unique to this fixture. crun names a container's cgroups after it at the
   * root of every hierarchy (the bundle sets no cgroupsPath), so a fixed name would collide with
   * the same benchmark running beside this one, or with the leftovers of one that was killed.
   */
  containerId(name: string): string {
    return `${basename(this.dir)}-${name}`;
  }

  /**
   * The naive way to start `count` idle containers: `crun run --detach` of the busybox bundle
   * (running `sleep`), `concurrency` at a time from a shell pipeline (no Node fork per container).
   * Returns how long until every one was started; the containers are deleted afterwards, and a
   * failure quotes what crun printed.
   */
  async naiveCrunStarts(count: number, concurrency: number): Promise<number> {
    const bundle = join(this.dir, 'bundle-idle');
    await mkdir(bundle, { recursive: true });
    const spec = JSON.parse(await readFile(join(this.bundle, 'config.json'), 'utf8')) as {
      process: { args: string[] };
      root: { path: string };
    };
    spec.process.args = ['/bin/sleep', '100000'];
    spec.root.path = this.rootfs;
    await writeFile(join(bundle, 'config.json'), JSON.stringify(spec));
    const errors = join(this.dir, 'naive-crun.log');
    const started = performance.now();
    let elapsed = 0;
    let failure: unknown;
    try {
      await runProgram(
        'bash',
        [
          '-c',
          // a detached container inherits the caller's stdio: a pipe here would never see its end
          `seq ${count} | xargs -P ${concurrency} -I{} ${this.crunPrefix} run --detach --bundle ${bundle} ${this.containerId('naive')}-{} > /dev/null 2>> ${errors}`,
        ],
        { timeoutMs: 30 * 60_000 },
      );
      elapsed = performance.now() - started;
      const running = await this.containers();
      if (running.length < count)
        throw new Error(`only ${running.length} of ${count} naive containers started`);
    } catch (error) {
      failure = error;
    }
    try {
      await this.deleteContainers(concurrency, errors);
    } catch (error) {
      failure ??= error;
    }
    if (failure !== undefined) {
      const printed = (await readFile(errors, 'utf8').catch(() => '')).trim().split('\n').slice(-5);
      throw new Error(
        `Naive crun starts failed: ${failure instanceof Error ? failure.message : 'unknown error'}; crun printed: ${printed.join(' | ') || 'nothing'}`,
        {
          cause: failure,
        },
      );
    }
    return elapsed;
  }

  /** Names of the baselines' containers. */
  private async containers(): Promise<string[]> {
    const root = join(this.dir, BASELINE_RUNTIME);
    return (await runProgram(hostProgram('crun'), ['--root', root, 'list', '-q']))
      .split('\n')
      .filter(Boolean);
  }

  /**
   * Deletes every baseline container of this fixture, with its cgroups. Under load a `delete --force` can
   * fail while the killed process has not yet left its cgroup, so what is left is tried again.
   */
  private async deleteContainers(concurrency: number, errors = '/dev/null'): Promise<void> {
    const crun = hostProgram('crun');
    const root = join(this.dir, BASELINE_RUNTIME);
    for (let attempt = 0; ; attempt++) {
      const left = await this.containers();
      if (left.length === 0) return;
      if (attempt === DELETE_ATTEMPTS)
        throw new Error(`${left.length} containers could not be deleted: ${left.slice(0, 5).join(', ')}`);
      if (attempt > 0) await sleep(100 * attempt);
      await runProgram(
        'bash',
        [
          '-c',
          `${crun} --root ${root} list -q | xargs -r -P ${concurrency} -I{} ${crun} --root ${root} delete --force {} > /dev/null 2>> ${errors}`,
        ],
        { timeoutMs: 30 * 60_000 },
      ).catch(() => undefined); // what failed is still listed, and tried again
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.platform.close();
      // a benchmark that failed midway may have left baseline containers running
      await this.deleteContainers(16);
    } finally {
      await rm(this.dir, { recursive: true, force: true });
    }
  }
}
