import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { tarArchive } from '../support/tar-writer.ts';

describe('Dockerfile builds in our own container backend', () => {
  let env: TestPlatform;
  let context: string;

  beforeAll(async () => {
    env = await createTestPlatform('dockerfile', { privateStore: true });
    context = join(env.dataDir, 'context');
    await mkdir(join(context, 'src'), { recursive: true });
    await writeFile(join(context, 'src', 'app.sh'), 'echo app says hi\n');
    await writeFile(join(context, 'notes.txt'), 'notes\n');
    await writeFile(join(context, 'bundle.tar'), tarArchive([{ path: 'lib/data.txt', data: 'from tar\n' }]));
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function dockerfile(text: string): Promise<string> {
    const path = join(context, 'Dockerfile');
    await writeFile(path, text);
    return path;
  }

  const threeRuns = (third: string): string => `FROM busybox:latest
ENV GREETING=hello
WORKDIR /app
RUN echo "step one $RANDOM" > /app/one
RUN echo "step two $RANDOM" > /app/two
RUN ${third}
COPY src/ /app/src/
COPY notes.txt .
ADD bundle.tar /opt/
USER nobody
`;

  it('builds every supported instruction into an environment', async () => {
    const { environment, steps } = await env.platform.buildFromDockerfile({
      file: await dockerfile(threeRuns('echo "$GREETING from $(pwd)" > /app/three')),
      name: 'built:1',
    });
    expect(steps.map((s) => s.outcome)).toEqual([
      'config',
      'config',
      'built',
      'built',
      'built',
      'built',
      'built',
      'built',
      'built',
      'config',
    ]);
    expect(environment.config).toEqual({ env: { GREETING: 'hello' }, workdir: '/app', user: 'nobody' });
    await using sandbox = await env.platform.createSandbox({ environment: 'built:1' });
    const seen = await sandbox.exec([
      'sh',
      '-c',
      'cat three notes.txt /opt/lib/data.txt; sh src/app.sh; pwd; echo $GREETING',
    ]);
    expect(seen.stdout).toBe('hello from /app\nnotes\nfrom tar\napp says hi\n/app\nhello\n');
  });

  it('rebuilds from cache after an edit to step 3, without re-running steps 1 and 2', async () => {
    const first = await env.platform.buildFromDockerfile({
      file: await dockerfile(threeRuns('echo first > /app/three')),
      name: 'cached:1',
    });
    const again = await env.platform.buildFromDockerfile({
      file: await dockerfile(threeRuns('echo first > /app/three')),
      name: 'cached:2',
    });
    expect(again.steps.filter((s) => s.outcome !== 'config').every((s) => s.outcome === 'cached')).toBe(true);
    expect(again.environment.layers).toEqual(first.environment.layers);
    const edited = await env.platform.buildFromDockerfile({
      file: await dockerfile(threeRuns('echo edited > /app/three')),
      name: 'cached:3',
    });
    const runs = edited.steps.filter((s) => s.instruction.startsWith('RUN'));
    expect(runs.map((s) => s.outcome)).toEqual(['cached', 'cached', 'built']);
    // the random numbers written by steps 1 and 2 are the first build's: they did not run again
    await using before = await env.platform.createSandbox({ environment: 'cached:1' });
    await using after = await env.platform.createSandbox({ environment: 'cached:3' });
    const read = async (s: typeof before): Promise<string> =>
      (await s.exec(['cat', '/app/one', '/app/two'])).stdout;
    expect(await read(after)).toBe(await read(before));
    const three = await after.exec(['cat', '/app/three']);
    expect(three.stdout, three.stderr).toBe('edited\n');
  });

  it('names the line of an unknown instruction, a failing RUN and a source outside the context', async () => {
    await expect(
      env.platform.buildFromDockerfile({
        file: await dockerfile('FROM busybox:latest\n\nFROBNICATE 80\n'),
        name: 'x:1',
      }),
    ).rejects.toThrow(/Dockerfile line 3: unknown instruction FROBNICATE/);
    await expect(
      env.platform.buildFromDockerfile({
        file: await dockerfile('FROM busybox:latest\nRUN echo broken >&2; exit 7\n'),
        name: 'x:1',
      }),
    ).rejects.toThrow(/Dockerfile line 2: RUN failed with exit code 7: broken/);
    await expect(
      env.platform.buildFromDockerfile({
        file: await dockerfile('FROM busybox:latest\nCOPY ../../etc/passwd /x\n'),
        name: 'x:1',
      }),
    ).rejects.toThrow(/line 2: "..\/..\/etc\/passwd" is outside the build context/);
    await expect(
      env.platform.buildFromDockerfile({ file: await dockerfile('FROM nosuch:1\n'), name: 'x:1' }),
    ).rejects.toThrow(/line 1: FROM nosuch:1: not in the store and not pulled .*--fallback-base/);
  });

  it("stops a RUN step at the build's time limit and names its line", async () => {
    await expect(
      env.platform.buildFromDockerfile({
        file: await dockerfile('FROM busybox:latest\nRUN echo one\nRUN sleep 600\n'),
        name: 'x:1',
        timeoutMs: 3000,
      }),
    ).rejects.toThrow(/Dockerfile line 3: RUN ran past the build's time limit of 3 s/);
  });
});
