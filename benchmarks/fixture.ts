import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import {
  agentBinaryPath,
  buildBusyboxRootfs,
  detectCgroupLayout,
  hostProgram,
  runProgram,
} from '../src/backends/index.ts';
import { Platform, defaultDataDir, defaultStoreDir, type PlatformClient } from '../src/platform/index.ts';

/**
 * What the benchmarks share: an embedded platform in a data folder of its own (the store is the
 * usual one), a busybox root folder and an OCI bundle for the baselines.
 */
export class BenchFixture implements AsyncDisposable {
  private constructor(
    readonly platform: PlatformClient,
    readonly dir: string,
    readonly rootfs: string,
    readonly bundle: string,
    /** Prefix that runs crun the way the backend does (see agent/launch.c): fair to both sides. */
    readonly crunPrefix: string,
  ) {}

  static async create(): Promise<BenchFixture> {
    const base = defaultDataDir();
    const dir = resolve(base, `bench-${process.pid}`);
    const platform = await Platform.local({ dataDir: dir, storeDir: defaultStoreDir(base) });
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

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.platform.close();
    } finally {
      await rm(this.dir, { recursive: true, force: true });
    }
  }
}
