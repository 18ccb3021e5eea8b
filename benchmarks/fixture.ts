import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
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
    /** Prefix that runs crun the way the backend does (see agent/launch.c): fair to both sides. */
    readonly crunPrefix: string,
  ) {}

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
    const crunPrefix = `${agentBinaryPath()} launch ${umount}-- ${hostProgram('crun')} --root ${join(dir, 'runtime')}`;
    return new BenchFixture(platform, dir, rootfs, bundle, crunPrefix);
  }

  /**
   * The naive way to start `count` idle containers: `crun run --detach` of the busybox bundle
   * (running `sleep`), `concurrency` at a time from a shell pipeline (no Node fork per container).
   * Returns how long until every one was started; the containers are deleted afterwards.
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
    const crun = hostProgram('crun');
    const root = join(this.dir, 'runtime');
    const started = performance.now();
    try {
      await runProgram(
        'bash',
        [
          '-c',
          // a detached container inherits the caller's stdio: a pipe here would never see its end
          `seq ${count} | xargs -P ${concurrency} -I{} ${this.crunPrefix} run --detach --bundle ${bundle} naive-{} > /dev/null 2>&1`,
        ],
        { timeoutMs: 30 * 60_000 },
      );
      const elapsed = performance.now() - started;
      const running = (await runProgram(crun, ['--root', root, 'list', '-q'])).split('\n').filter(Boolean);
      if (running.length < count)
        throw new Error(`only ${running.length} of ${count} naive containers started`);
      return elapsed;
    } finally {
      await runProgram(
        'bash',
        [
          '-c',
          `${crun} --root ${root} list -q | xargs -r -P ${concurrency} -I{} ${crun} --root ${root} delete --force {} > /dev/null 2>&1`,
        ],
        { timeoutMs: 30 * 60_000 },
      );
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.platform.close();
    } finally {
      await rm(this.dir, { recursive: true, force: true });
    }
  }
}
