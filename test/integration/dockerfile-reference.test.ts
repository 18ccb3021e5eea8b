import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, debianMirrorRules, type TestPlatform } from '../support/platform.ts';
import { tarArchive } from '../support/tar-writer.ts';

/** The whole reference that published task images use, built in our own containers. */
describe('Dockerfile reference', () => {
  let env: TestPlatform;
  let context: string;

  beforeAll(async () => {
    env = await createTestPlatform('dockerfile-reference', { privateStore: true, seed: ['debian:bookworm'] });
    context = join(env.dataDir, 'context');
    await mkdir(join(context, 'scripts'), { recursive: true });
    await mkdir(join(context, 'secret'), { recursive: true });
    await writeFile(join(context, 'a.txt'), 'alpha\n');
    await writeFile(join(context, 'b.txt'), 'beta\n');
    await writeFile(join(context, 'ignored.txt'), 'never copied\n');
    await writeFile(join(context, 'notes.md'), 'not a .txt\n');
    await writeFile(join(context, 'secret', 'key'), 'never copied\n');
    await writeFile(join(context, 'scripts', 'run.sh'), '#!/bin/sh\necho running "$@"\n', { mode: 0o644 });
    await writeFile(
      join(context, 'bundle.tar.gz'),
      gzipSync(tarArchive([{ path: 'lib/data.txt', data: 'from a gzip tar\n' }])),
    );
    await writeFile(join(context, '.dockerignore'), '# not for the image\nignored.txt\nsecret\n');
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function dockerfile(name: string, text: string): Promise<string> {
    const path = join(context, name);
    await writeFile(path, text);
    return path;
  }

  const FULL = `# syntax=docker/dockerfile:1
# Every instruction kind, as published task images write them.
ARG BASE=busybox:latest
ARG GREETING=hello
FROM --platform=$BUILDPLATFORM \${BASE} AS builder
ARG GREETING
WORKDIR /src
COPY *.txt ./
RUN --mount=type=cache,target=/root/.cache \\
    cat a.txt b.txt > joined && \\
    # a comment inside a continued line
    echo "$GREETING" > greeting
RUN <<EOF
echo from heredoc > /src/heredoc
echo second line >> /src/heredoc
EOF
COPY . /ctx

FROM \${BASE}
LABEL org.example.name="demo app" version=2
ENV APP_HOME=/app PATH=/app/bin:$PATH
WORKDIR $APP_HOME
COPY --from=builder /src/joined /src/greeting ./
COPY --from=builder /src/heredoc data/
COPY --from=builder /ctx /ctx
COPY --chown=1000:1000 --chmod=0750 scripts/ bin/
COPY <<EOF config.ini
[app]
home = \${APP_HOME}
EOF
ADD bundle.tar.gz /opt/
SHELL ["/bin/sh", "-ec"]
RUN ["sh", "-c", "echo exec form > /app/exec"]
RUN cat <<EOF > /app/stdin.txt
fed on stdin
EOF
EXPOSE 8080/tcp 9090
VOLUME ["/data"]
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=5s CMD wget -q localhost:8080 || exit 1
USER 1000
CMD ["--serve"]
ENTRYPOINT ["/app/bin/run.sh"]
`;

  it('builds every instruction kind: stages, ARGs, here-documents, COPY flags, .dockerignore, metadata', async () => {
    const { environment } = await env.platform.buildFromDockerfile({
      file: await dockerfile('Dockerfile.full', FULL),
      name: 'reference:1',
      buildArgs: { GREETING: 'bonjour' },
    });
    expect(environment.config).toMatchObject({ workdir: '/app', user: '1000' });
    expect(environment.config.env['PATH']).toMatch(/^\/app\/bin:/);
    expect(environment.image).toMatchObject({
      labels: { 'org.example.name': 'demo app', version: '2' },
      exposedPorts: ['8080/tcp', '9090'],
      volumes: ['/data'],
      stopSignal: 'SIGTERM',
      cmd: ['--serve'],
      entrypoint: ['/app/bin/run.sh'],
      shell: ['/bin/sh', '-ec'],
    });
    expect(environment.image?.healthcheck).toMatch(/wget -q localhost:8080/);
    await using sandbox = await env.platform.createSandbox({ environment: 'reference:1' });
    const read = async (command: string): Promise<string> => {
      const run = await sandbox.exec(['sh', '-c', command], { user: 'root' });
      expect(run.exitCode, run.stderr).toBe(0);
      return run.stdout;
    };
    expect(await read('cat /app/joined /app/greeting')).toBe('alpha\nbeta\nbonjour\n');
    expect(await read('cat /app/data/heredoc')).toBe('from heredoc\nsecond line\n');
    expect(await read('cat /app/config.ini')).toBe('[app]\nhome = /app\n');
    expect(await read('cat /opt/lib/data.txt /app/exec /app/stdin.txt')).toBe(
      'from a gzip tar\nexec form\nfed on stdin\n',
    );
    expect(await read('stat -c "%u:%g %a" /app/bin/run.sh')).toBe('1000:1000 750\n');
    expect(await read('stat -c "%u:%g" /app/joined')).toBe('0:0\n');
    // the glob took *.txt but what .dockerignore excludes never left the context
    expect(await read('ls /ctx | sort | tr "\\n" " "')).toBe(
      'Dockerfile.full a.txt b.txt bundle.tar.gz notes.md scripts ',
    );
    expect(await read('/app/bin/run.sh x')).toBe('running x\n');
  });

  it('builds a named target stage', async () => {
    const { environment } = await env.platform.buildFromDockerfile({
      file: await dockerfile('Dockerfile.full', FULL),
      name: 'reference-builder:1',
      target: 'builder',
    });
    await using sandbox = await env.platform.createSandbox({ environment: 'reference-builder:1' });
    expect(environment.config.workdir).toBe('/src');
    expect((await sandbox.exec(['cat', '/src/greeting'])).stdout).toBe('hello\n');
  });

  it('names the file and line of what it cannot do', async () => {
    const cases: [string, RegExp][] = [
      [
        'FROM --platform=linux/arm64 busybox:latest\n',
        /line 1: FROM --platform=linux\/arm64: only linux\/amd64/,
      ],
      [
        'FROM busybox:latest\nRUN --mount=type=secret,id=key true\n',
        /line 2: RUN --mount=type=secret is not supported/,
      ],
      ['FROM busybox:latest\nCOPY --from=nosuch /x /y\n', /line 2: --from=nosuch names no earlier stage/],
      ['FROM busybox:latest\nADD http://example.com/x /x\n', /line 2: ADD from a URL is not supported/],
      ['FROM busybox:latest\nCOPY --frm=a x y\n', /line 2: COPY does not take --frm/],
      ['FROM busybox:latest\nCOPY *.nothing /x\n', /line 2: no file in the build context matches/],
      [
        'FROM busybox:latest\nCOPY ignored.txt /x\n',
        /line 2: COPY\/ADD source ignored.txt is excluded by .dockerignore/,
      ],
      [
        'FROM busybox:latest\nRUN <<EOF\necho never closed\n',
        /line 2: here-document <<EOF has no closing EOF line/,
      ],
      ['FROM busybox:latest AS\n', /line 1: FROM takes an image and optionally AS name/],
    ];
    for (const [text, why] of cases) {
      await expectCode(
        env.platform.buildFromDockerfile({ file: await dockerfile('Dockerfile.bad', text), name: 'bad:1' }),
        'invalid_argument',
        why,
      );
    }
  });

  it('runs RUN steps with the network of the build rules, and says so when a step had none', async () => {
    await using networked = await createTestPlatform('dockerfile-network', {
      networkRules: await debianMirrorRules(),
    });
    const file = await dockerfile(
      'Dockerfile.apt',
      'FROM debian:bookworm\nRUN apt-get update && apt-get install -y --no-install-recommends jq\n',
    );
    const { environment } = await networked.platform.buildFromDockerfile({ file, name: 'with-jq:1' });
    await using sandbox = await networked.platform.createSandbox({
      environment: `${environment.name}:${environment.version}`,
    });
    expect((await sandbox.exec(['jq', '-n', '6*7'])).stdout).toBe('42\n');
    // the same build offline fails, naming the missing network, rather than "succeeding"
    await expectCode(
      networked.platform.buildFromDockerfile({ file, name: 'offline:1', network: [] }),
      'failed_precondition',
      /line 2: RUN failed .*the step had no network/,
    );
  });
});
