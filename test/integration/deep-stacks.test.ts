import { mkdir, readFile, readdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deepTask } from '../../scripts/deep-dockerfile.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

/** Mounts of the node's namespace under `dir`, and loop devices backed by files under it. */
async function mountsAndLoopsUnder(dir: string): Promise<string[]> {
  const mounts = (await readFile('/proc/self/mountinfo', 'utf8'))
    .split('\n')
    .filter((line) => line.includes(dir));
  const loops: string[] = [];
  for (const name of await readdir('/sys/block').catch(() => [] as string[])) {
    if (!name.startsWith('loop')) continue;
    const backing = await readFile(`/sys/block/${name}/loop/backing_file`, 'utf8').catch(() => '');
    if (backing.includes(dir)) loops.push(`${name}: ${backing.trim()}`);
  }
  return [...mounts, ...loops];
}

/**
 * Dockerfiles as deep as real ones: 200 steps, each RUN or COPY a layer. The classic overlay
 * option string held ~42 layers; the stack is now mounted a layer per fsconfig call, and its
 * base flattened into one image past 32 layers.
 */
describe('deep layer stacks', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('deep-stacks', { privateStore: true });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
    // nothing of the test's platform is left mounted: no layer, overlay or loop device
    expect(await mountsAndLoopsUnder(env.dataDir)).toEqual([]);
  });

  it('builds and runs a 200-step Dockerfile, deletions kept across the flattened base', async () => {
    const context = join(env.dataDir, 'deep');
    for (const [path, text] of Object.entries(deepTask(200, 'busybox:latest'))) {
      await mkdir(dirname(join(context, path)), { recursive: true });
      await writeFile(join(context, path), text);
    }
    const { environment } = await env.platform.buildFromDockerfile({
      file: join(context, 'environment', 'Dockerfile'),
      name: 'deep:1',
    });
    expect(environment.layers.length).toBeGreaterThan(150);
    // the build's steps past 32 layers stacked flattened bases, made on the node
    const flat = await readdir(join(env.dataDir, 'layers-flat'));
    expect(flat.filter((name) => /^[0-9a-f]{64}\.erofs$/.test(name)).length).toBeGreaterThan(5);

    await using sandbox = await env.platform.createSandbox({ environment: 'deep:1' });
    const seen = await sandbox.exec([
      'sh',
      '-c',
      [
        'cat /deep/first /deep/last /deep/steps/0197 /deep/steps/0007',
        // made at step 3, deleted at step 150: both inside the flattened base, in different chunks
        'test -e /deep/steps/0003 && echo 0003 is back',
        // made at step 5 (flattened), deleted at step 199 (a top layer over the flattened base)
        'test -e /deep/steps/0005 && echo 0005 is back',
        // replaced by a fresh folder at step 160: opaque, the old file gone
        'ls /deep/dir',
        'ls /deep/steps | wc -l',
        'echo $STEP_196',
      ].join('; '),
    ]);
    expect(seen.stderr).toBe('');
    const expected = /= "(\d+) first last"/.exec(deepTask(200)['tests/test.sh'] ?? '')?.[1];
    expect(seen.stdout).toBe(`first\nlast\n197\n7\nnew\n${expected}\n196\n`);

    // the sandbox writes over the deep stack as over any other
    expect(
      (
        await sandbox.exec([
          'sh',
          '-c',
          'rm /deep/first && echo w > /deep/steps/0197 && cat /deep/steps/0197',
        ])
      ).stdout,
    ).toBe('w\n');
    expect((await sandbox.exec(['ls', '/deep/first'])).exitCode).not.toBe(0);
  });
});
