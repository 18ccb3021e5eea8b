import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, lstatSync, readFileSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { chown, mkdir, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isSandgymError } from '../../src/common/index.ts';
import { buildLayerFromOci, buildLayerFromTar } from '../../src/platform/index.ts';
import { RootedTree, withRootedTree } from '../../src/platform/layer-build/rooted-tree.ts';
import { MAX_IMAGE_LAYERS } from '../../src/platform/layer-build/from-oci.ts';
import { MAX_TREE_DEPTH } from '../../src/platform/layer-build/rooted-tree.ts';
import {
  ArchiveBudget,
  DEFAULT_ARCHIVE_LIMITS,
  extractTar,
  normaliseFolderTimes,
  type ArchiveLimits,
  type WhiteoutMode,
} from '../../src/platform/layer-build/tar-extract.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { TestRegistry, writeOciLayout } from '../support/registry.ts';
import { paxRecord, tarArchive, tarHeader, type TestTarEntry } from '../support/tar-writer.ts';
import { fingerprint, generateArchive, problemsInRoot, seededRandom } from './archive-fuzz.ts';
import { attack } from './summary.ts';

const run = promisify(execFile);

/** Every message in an error and its causes: a refusal must not quote the bytes it was refused. */
function errorText(error: unknown): string {
  const parts: string[] = [];
  for (let cause = error; cause instanceof Error; cause = cause.cause) parts.push(cause.message);
  return parts.join(' <- ');
}

/** Each file of a tree by path: kind, mode, owner, size, content or target, and its hard-link group. */
function treeSignature(root: string, paths: readonly string[]): Map<string, string> {
  const signature = new Map<string, string>();
  const groups = new Map<number, string>();
  const visit = (rel: string): void => {
    const path = join(root, rel);
    const stats = lstatSync(path);
    const owner = `${stats.mode.toString(8)} ${stats.uid}:${stats.gid}`;
    if (stats.isSymbolicLink()) signature.set(rel, `link ${owner} ${readlinkSync(path)}`);
    else if (stats.isFile()) {
      const group = stats.nlink > 1 ? (groups.get(stats.ino) ?? rel) : rel;
      groups.set(stats.ino, group);
      const digest = createHash('sha256').update(readFileSync(path)).digest('hex');
      // tar keeps whole seconds
      signature.set(rel, `file ${owner} ${Math.floor(stats.mtimeMs / 1000)} ${digest} linked-with ${group}`);
    } else if (stats.isDirectory()) {
      signature.set(rel, `dir ${owner}`);
      for (const name of readdirSync(path).sort()) visit(`${rel}/${name}`);
    } else signature.set(rel, `other ${owner}`);
  };
  for (const path of paths) visit(path);
  return signature;
}

/**
 * The reported attack: a folder with a file, the folder replaced by a symlink to `target`, then a
 * hard link to the file through it (which linked the host's /etc/shadow into an image).
 */
function linkThrough(target: string): TestTarEntry[] {
  return [
    { path: 'd/', type: 'dir' },
    { path: 'd/secret', data: 'decoy' },
    { path: 'd', type: 'symlink', linkTarget: target },
    { path: 'x', type: 'hardlink', linkTarget: 'd/secret' },
  ];
}

/**
 * Archives come from people who control every byte of them: a task author's Dockerfile and build
 * context (ADD, COPY --from a stage its RUN steps made), a user's `--from-tar` / `--from-oci`
 * file, a registry's image. Whatever they hold, nothing outside the extraction root may be read
 * into a layer, created, changed, linked or removed, and the store must stay usable.
 */
describe('archives under attack', () => {
  let env: TestPlatform;
  /** The "host": files an escape would read, link, change or remove. */
  let host: string;
  /** A folder another build keeps in the store's scratch space: whiteouts of ".." went for it. */
  let neighbour: string;
  let count = 0;
  const SECRET = `host-secret-${randomBytes(8).toString('hex')}`;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-archives', { privateStore: true, seed: ['debian:bookworm'] });
    host = join(env.dataDir, 'host');
    await mkdir(join(host, 'dir'), { recursive: true });
    await mkdir(join(host, 'owned', 'sub'), { recursive: true, mode: 0o701 });
    await chown(join(host, 'owned', 'sub'), 4243, 4243);
    await writeFile(join(host, 'secret'), `${SECRET}\n`, { mode: 0o600 });
    await writeFile(join(host, 'dir', 'inner'), `${SECRET}\n`);
    await writeFile(join(host, 'passwd'), 'intruder:x:4242:4242::/:/bin/sh\n');
    // an image config, as another tenant's would sit in the store's blob cache
    await writeFile(join(host, 'config.json'), JSON.stringify({ config: { Env: [`STOLEN=${SECRET}`] } }));
    await writeFile(join(host, 'secret.tar'), tarArchive([{ path: 'stolen', data: SECRET }]));
    neighbour = join(env.dataDir, 'store', 'tmp', 'another-build');
    await mkdir(neighbour, { recursive: true });
    await writeFile(join(neighbour, 'keep'), 'in progress');
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  /** Looks at a layer stack's merged tree on this host. */
  function inLayers<T>(layers: readonly string[], look: (root: string) => T): Promise<T> {
    return env.platform.withLayerStack(layers, (root) => Promise.resolve(look(root)));
  }

  async function file(name: string, data: Buffer | string): Promise<string> {
    const path = join(env.dataDir, `${count++}-${name}`);
    await writeFile(path, data);
    return path;
  }

  /**
   * Docker save output of one layer: manifest.json naming config.json and l0/layer.tar, each of
   * those given as an entry (its data, or a symlink).
   */
  type Member = Omit<TestTarEntry, 'path'>;
  function dockerSave(layer: Member, config: Member = { data: '{"config":{}}' }): Buffer {
    return tarArchive([
      { path: 'manifest.json', data: JSON.stringify([{ Config: 'config.json', Layers: ['l0/layer.tar'] }]) },
      { path: 'config.json', ...config },
      { path: 'l0/layer.tar', ...layer },
    ]);
  }

  /** The two archive surfaces: a layer tar (whiteouts kept) and an image (whiteouts applied). */
  const SURFACES = {
    'from-tar': async (entries: TestTarEntry[]) =>
      buildLayerFromTar(env.platform.store, await file('layer.tar', tarArchive(entries))),
    'from-oci': async (entries: TestTarEntry[]) =>
      buildLayerFromOci(
        env.platform.store,
        await file('image.tar', dockerSave({ data: tarArchive(entries) })),
      ),
  };

  /**
   * Runs a build that must be refused, and checks it did no harm: refused as bad input (the
   * message matching), no layer stored, not a byte of the secret in the error, the host folder
   * and the store's scratch space as they were.
   */
  async function refusedWithoutHarm(
    build: () => Promise<unknown>,
    message: RegExp,
    code: 'invalid_argument' | 'not_found' = 'invalid_argument',
  ): Promise<void> {
    const layers = (await env.platform.store.listLayers()).length;
    const before = fingerprint(host, '');
    const error: unknown = await build().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isSandgymError(error, code), `expected a refusal (${code}), got ${String(error)}`).toBe(true);
    expect(errorText(error)).toMatch(message);
    expect(errorText(error)).not.toContain(SECRET);
    expect((await env.platform.store.listLayers()).length).toBe(layers);
    expect(fingerprint(host, '')).toEqual(before);
    expect(statSync(join(env.dataDir, 'store', 'tmp')).isDirectory()).toBe(true);
    expect(readFileSync(join(neighbour, 'keep'), 'utf8')).toBe('in progress');
  }

  describe('hard links', () => {
    // the scratch root an archive unpacks into is <data>/store/tmp/<scratch>: three levels up is
    // the data folder, which holds the host folder
    const climb = '../../../host';
    const variants: [string, () => TestTarEntry[]][] = [
      ['through a folder replaced by an absolute symlink (the reported attack)', () => linkThrough(host)],
      ['through a folder replaced by a relative symlink climbing out', () => linkThrough(climb)],
      [
        'through a grandparent replaced by a symlink',
        () => [
          { path: 'a/dir/inner', data: 'decoy' },
          { path: 'a', type: 'symlink', linkTarget: host },
          { path: 'usr/x', type: 'hardlink', linkTarget: 'a/dir/inner' },
        ],
      ],
      ['to an absolute host path', () => [{ path: 'x', type: 'hardlink', linkTarget: join(host, 'secret') }]],
      ['to a path climbing out', () => [{ path: 'x', type: 'hardlink', linkTarget: `${climb}/secret` }]],
      [
        'to a symlink out',
        () => [
          { path: 's', type: 'symlink', linkTarget: join(host, 'secret') },
          { path: 'x', type: 'hardlink', linkTarget: 's' },
        ],
      ],
      [
        'to a file since replaced by a symlink out',
        () => [
          { path: 'f', data: 'decoy' },
          { path: 'f', type: 'symlink', linkTarget: join(host, 'secret') },
          { path: 'x', type: 'hardlink', linkTarget: 'f' },
        ],
      ],
      [
        'into a folder that is a symlink out',
        () => [
          { path: 'f', data: 'planted' },
          { path: 'out', type: 'symlink', linkTarget: host },
          { path: `${host.slice(1)}/`, type: 'dir' },
          { path: 'out/planted', type: 'hardlink', linkTarget: 'f' },
        ],
      ],
    ];
    for (const [name, entries] of variants)
      for (const [surface, build] of Object.entries(SURFACES))
        it(`refuses a hard link ${name} (${surface})`, () =>
          attack('archive', `hard link ${name} (${surface})`, () =>
            refusedWithoutHarm(() => build(entries()), /is refused/),
          ));
  });

  describe('whiteouts', () => {
    const variants: [string, () => TestTarEntry[]][] = [
      ['of ".." at the top (the reported attack: the store\'s tmp)', () => [{ path: '.wh...' }]],
      ['of "." at the top', () => [{ path: '.wh..' }]],
      ['with an empty name', () => [{ path: '.wh.' }]],
      ['of ".." in a folder', () => [{ path: 'a/b/', type: 'dir' }, { path: 'a/b/.wh...' }]],
      ['of "." in a folder', () => [{ path: 'a/', type: 'dir' }, { path: 'a/.wh..' }]],
      ['of ".." under a long pax name', () => [{ path: `${'p'.repeat(150)}/.wh...` }]],
      ['of ".." under a GNU long name', () => [{ path: `${'g'.repeat(150)}/.wh...`, longNames: 'gnu' }]],
      ['whose name holds a NUL byte', () => [{ path: `.wh.x\0..`, longNames: 'pax' }]],
      ['of a name longer than a folder holds', () => [{ path: `.wh.${'n'.repeat(300)}` }]],
      [
        'through a symlink out',
        () => [{ path: 'd', type: 'symlink', linkTarget: host }, { path: 'd/.wh.secret' }],
      ],
      [
        'marking a symlink out opaque',
        () => [
          { path: 'd/', type: 'dir' },
          { path: 'd', type: 'symlink', linkTarget: join(host, 'dir') },
          { path: 'd/.wh..wh..opq' },
        ],
      ],
    ];
    for (const [name, entries] of variants)
      for (const [surface, build] of Object.entries(SURFACES))
        it(`refuses a whiteout ${name} (${surface})`, () =>
          attack('archive', `whiteout ${name} (${surface})`, () =>
            refusedWithoutHarm(() => build(entries()), /is refused/),
          ));

    it('keeps the store usable after every whiteout attack', async () => {
      const layer = await buildLayerFromTar(
        env.platform.store,
        await file('after.tar', tarArchive([{ path: 'ok', data: 'fine' }])),
      );
      expect(await inLayers([layer.digest], (root) => readFileSync(join(root, 'ok'), 'utf8'))).toBe('fine');
    });
  });

  describe('image files read from an unpacked archive', () => {
    const layer = (): Buffer => tarArchive([{ path: 'ok', data: 'fine' }]);
    const sha = (data: Buffer | string): string => createHash('sha256').update(data).digest('hex');
    /** An OCI layout tar whose one layer blob is `blob` (a symlink out, say), named by `digest`. */
    const ociLayout = (
      blobEntry: (digest: string) => TestTarEntry,
      digest: string,
      config = '{}',
    ): Buffer => {
      const manifest = JSON.stringify({
        config: { digest: `sha256:${sha(config)}` },
        layers: [{ digest: `sha256:${digest}`, mediaType: 'application/vnd.oci.image.layer.v1.tar' }],
      });
      return tarArchive([
        { path: 'index.json', data: JSON.stringify({ manifests: [{ digest: `sha256:${sha(manifest)}` }] }) },
        { path: `blobs/sha256/${sha(manifest)}`, data: manifest },
        { path: `blobs/sha256/${sha(config)}`, data: config },
        blobEntry(digest),
      ]);
    };
    const variants: [string, () => Promise<string>][] = [
      [
        'manifest.json as a symlink to a host file (its bytes would be quoted by the JSON error)',
        () =>
          file(
            'image.tar',
            tarArchive([{ path: 'manifest.json', type: 'symlink', linkTarget: join(host, 'secret') }]),
          ),
      ],
      [
        'manifest.json as a relative symlink climbing out',
        () =>
          file(
            'image.tar',
            tarArchive([{ path: 'manifest.json', type: 'symlink', linkTarget: '../../../host/secret' }]),
          ),
      ],
      [
        "the image config as a symlink to another image's config in the store",
        () =>
          file(
            'image.tar',
            dockerSave({ data: layer() }, { type: 'symlink', linkTarget: join(host, 'config.json') }),
          ),
      ],
      [
        'a layer as a symlink to a host tar',
        () => file('image.tar', dockerSave({ type: 'symlink', linkTarget: join(host, 'secret.tar') })),
      ],
      [
        'index.json as a symlink to a host file',
        () =>
          file(
            'layout.tar',
            tarArchive([{ path: 'index.json', type: 'symlink', linkTarget: join(host, 'secret') }]),
          ),
      ],
      [
        "a layer blob as a symlink to a host file named by that file's digest",
        () =>
          file(
            'layout.tar',
            ociLayout(
              (digest) => ({
                path: `blobs/sha256/${digest}`,
                type: 'symlink',
                linkTarget: join(host, 'secret.tar'),
              }),
              sha(readFileSync(join(host, 'secret.tar'))),
            ),
          ),
      ],
      [
        'a layer blob symlinked out of an OCI layout folder',
        async () => {
          const layout = join(env.dataDir, `layout-${count++}`);
          const digest = sha(readFileSync(join(host, 'secret.tar')));
          await writeOciLayout(layout, { layers: [[{ path: 'ok', data: 'fine' }]], config: {} });
          const manifestPath = join(layout, 'blobs/sha256');
          // point the layout's one layer at the host tar, by its digest
          const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as {
            manifests: { digest: string }[];
          };
          const manifestFile = join(manifestPath, index.manifests[0]!.digest.slice('sha256:'.length));
          const manifest = JSON.parse(readFileSync(manifestFile, 'utf8')) as { layers: { digest: string }[] };
          manifest.layers[0]!.digest = `sha256:${digest}`;
          const text = JSON.stringify(manifest);
          await writeFile(join(manifestPath, sha(text)), text);
          await writeFile(
            join(layout, 'index.json'),
            JSON.stringify({ manifests: [{ digest: `sha256:${sha(text)}` }] }),
          );
          await symlink(join(host, 'secret.tar'), join(manifestPath, digest));
          return layout;
        },
      ],
    ];
    for (const [name, archive] of variants)
      it(`refuses ${name}`, () =>
        attack('archive', `image read: ${name}`, async () => {
          const path = await archive();
          await refusedWithoutHarm(
            () => buildLayerFromOci(env.platform.store, path),
            /is refused|does not exist|is neither docker save output/,
          );
        }));
  });

  describe('Dockerfile ADD and COPY --from', () => {
    async function context(dockerfile: string, files: Record<string, Buffer | string> = {}): Promise<string> {
      const dir = join(env.dataDir, `context-${count++}`);
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, 'Dockerfile'), dockerfile);
      await writeFile(join(dir, 'notes.txt'), 'notes\n');
      for (const [name, data] of Object.entries(files)) await writeFile(join(dir, name), data);
      return join(dir, 'Dockerfile');
    }
    const build = (file: string) => () =>
      env.platform.buildFromDockerfile({ file, name: `attack:${count++}` });
    /** Builds `prefix` first (the stage an attack needs: its RUN layers are legitimate), then the attack on it. */
    async function attackOn(prefix: string, line: string, message: RegExp): Promise<void> {
      await build(await context(prefix))();
      await refusedWithoutHarm(build(await context(`${prefix}${line}\n`)), message);
    }
    // a stage a task author's RUN steps made: links to the host's folders, absolute and climbing
    const STAGE = `FROM busybox:latest AS stage\nRUN ln -s HOST /data && ln -s ../../../../../../../../../../../.. /up && ln -s HOST/secret /s\nFROM busybox:latest\n`;

    for (const [name, copy] of [
      ['a file through an absolute symlink in the stage', 'COPY --from=stage /data/secret /x'],
      ['a file through a symlink climbing out of the stage', 'COPY --from=stage /up/HOST/secret /x'],
      ['a folder through a symlink in the stage', 'COPY --from=stage /data/ /copied/'],
      ['a deeper file through a symlink in the stage', 'COPY --from=stage /data/dir/inner /x'],
      ['a symlink to a host file', 'COPY --from=stage /s /x'],
    ] as const)
      it(`never copies the host's files: COPY --from ${name}`, () =>
        attack('archive', `COPY --from ${name}`, async () => {
          await attackOn(
            STAGE.replaceAll('HOST', host),
            copy.replaceAll('HOST', host),
            /line 4: COPY --from source .* does not exist/,
          );
        }));

    it("never takes an owner from the host's /etc/passwd for --chown", () =>
      attack('archive', 'COPY --chown through a symlinked /etc/passwd', async () => {
        await attackOn(
          `FROM busybox:latest\nRUN rm /etc/passwd && ln -s ${host}/passwd /etc/passwd\n`,
          'COPY --chown=intruder notes.txt /n',
          /line 3: --chown: no user "intruder"/,
        );
      }));

    it("never takes a folder's owner and mode from the host for WORKDIR", () =>
      attack('archive', 'WORKDIR through a symlink in the stack', async () => {
        const file = await context(`FROM busybox:latest\nRUN ln -s ${host}/owned /w\nWORKDIR /w/sub\n`);
        const { environment } = await build(file)();
        const stats = await inLayers(environment.layers, (root) => lstatSync(join(root, 'w', 'sub')));
        expect(stats.uid).toBe(0);
        expect(stats.mode & 0o777).toBe(0o755);
      }));

    for (const [name, entries] of [
      ['a hard link through a folder replaced by a symlink', linkThrough('HOST')],
      ['a whiteout of ".."', [{ path: '.wh...' }]],
      [
        'a file through a symlink out',
        [
          { path: 'd', type: 'symlink', linkTarget: 'HOST' },
          { path: 'd/planted', data: 'x' },
        ],
      ],
    ] as [string, TestTarEntry[]][])
      it(`refuses ADD of an archive with ${name}`, () =>
        attack('archive', `ADD of an archive with ${name}`, async () => {
          const archive = tarArchive(
            entries.map((e) => (e.linkTarget ? { ...e, linkTarget: e.linkTarget.replace('HOST', host) } : e)),
          );
          const file = await context('FROM busybox:latest\nADD evil.tar /opt/\n', { 'evil.tar': archive });
          await refusedWithoutHarm(build(file), /line 2: ADD .* is refused/);
        }));

    it("holds ADD's unpacking and every other step to the build's time limit", () =>
      attack('archive', 'a build step outside the time limit (ADD, FROM)', async () => {
        const slow = tarArchive(Array.from({ length: 3000 }, (_, i) => ({ path: `many/f${i}`, data: 'x' })));
        const file = await context('FROM busybox:latest\nADD slow.tar /opt/\n', { 'slow.tar': slow });
        const error: unknown = await env.platform
          .buildFromDockerfile({ file, name: `attack:${count++}`, timeoutMs: 1 })
          .then(
            () => undefined,
            (e: unknown) => e,
          );
        expect(isSandgymError(error, 'failed_precondition'), String(error)).toBe(true);
        expect(errorText(error)).toMatch(/line [12]: .*time limit/);
      }));

    it('refuses COPY --exclude and --parents rather than ignoring them', () =>
      attack('archive', 'COPY flags silently ignored', async () => {
        for (const line of [
          'COPY --exclude=*.txt . /ctx/',
          'COPY --parents notes.txt /ctx/',
          'ADD --exclude=x . /ctx/',
        ])
          await refusedWithoutHarm(
            build(await context(`FROM busybox:latest\n${line}\n`)),
            /line 2: (COPY|ADD) --(exclude|parents) is not supported/,
          );
      }));

    it('refuses a stage alias that reads as an index, and matches aliases case-insensitively', () =>
      attack('archive', 'stage alias and index confusion', async () => {
        // "AS 1" on the first stage once made --from=1 pick it instead of the second
        const confused = `FROM busybox:latest AS 1\nRUN echo first > /which\nFROM busybox:latest\nRUN echo second > /which\nFROM busybox:latest\nCOPY --from=1 /which /which\n`;
        await refusedWithoutHarm(build(await context(confused)), /"1" is no stage name/);
        const twice = `FROM busybox:latest AS a\nFROM busybox:latest AS A\n`;
        await refusedWithoutHarm(build(await context(twice)), /already named "a"/);
      }));

    it('honest twin: --from by index and by alias in any case picks the stage Docker picks', async () => {
      const file = await context(
        `FROM busybox:latest AS First\nRUN echo first > /which\nFROM busybox:latest\nRUN echo second > /which\nFROM busybox:latest\nCOPY --from=FIRST /which /a\nCOPY --from=1 /which /b\n`,
      );
      const { environment } = await build(file)();
      const seen = await inLayers(environment.layers, (root) =>
        ['a', 'b'].map((n) => readFileSync(join(root, n), 'utf8')),
      );
      expect(seen).toEqual(['first\n', 'second\n']);
    });

    it("follows the image's own symlinks for COPY's destination, inside the image", () =>
      attack('archive', 'COPY into a symlinked folder of the image (merged /usr)', async () => {
        const file = await context(
          `FROM busybox:latest
RUN mkdir -p /usr/mybin && ln -s usr/mybin /mybin && ln -s /usr/mybin /abs && ln -s ../../../../.. /up
COPY notes.txt /mybin/
COPY notes.txt /abs/sub/
COPY notes.txt /up/etc/escaped
WORKDIR /app
COPY notes.txt /app
COPY notes.txt /abs
`,
        );
        const { environment } = await build(file)();
        const seen = await inLayers(environment.layers, (root) => ({
          link: readlinkSync(join(root, 'mybin')),
          abs: readlinkSync(join(root, 'abs')),
          copied: readFileSync(join(root, 'usr/mybin/notes.txt'), 'utf8'),
          sub: readFileSync(join(root, 'usr/mybin/sub/notes.txt'), 'utf8'),
          // a link climbing out of the image resolves at its root, as Docker's does
          escaped: readFileSync(join(root, 'etc/escaped'), 'utf8'),
          // a folder of the image named without a trailing slash is copied into, not replaced
          app: readFileSync(join(root, 'app/notes.txt'), 'utf8'),
          mybin: readdirSync(join(root, 'usr/mybin')).sort(),
        }));
        expect(seen).toEqual({
          link: 'usr/mybin',
          abs: '/usr/mybin',
          copied: 'notes\n',
          sub: 'notes\n',
          escaped: 'notes\n',
          app: 'notes\n',
          mybin: ['notes.txt', 'sub'],
        });
        expect(existsSync(join(host, 'etc'))).toBe(false);
      }));

    it('honest twin: COPY --from follows links inside the stage, --chown names its users, ADD unpacks', async () => {
      const honest = tarArchive([
        { path: 'lib/', type: 'dir' },
        { path: 'lib/a', data: 'shared\n', mode: 0o755 },
        { path: 'lib/b', type: 'hardlink', linkTarget: 'lib/a' },
        { path: 'lib/env', type: 'symlink', linkTarget: '/usr/bin/env' },
      ]);
      const file = await context(
        `FROM busybox:latest AS stage
RUN mkdir -p /srv/tree/sub && echo inside > /srv/file && echo deep > /srv/tree/sub/f && ln -s /srv /data && ln -s file /srv/alias
FROM busybox:latest
COPY --from=stage /data/file /x
COPY --from=stage /data/tree /tree
COPY --from=stage /srv/alias /alias
COPY --chown=nobody notes.txt /n
ADD honest.tar /opt/
`,
        { 'honest.tar': honest },
      );
      const { environment } = await env.platform.buildFromDockerfile({ file, name: 'honest:1' });
      await using sandbox = await env.platform.createSandbox({
        environment: `${environment.name}:${environment.version}`,
      });
      const seen = await sandbox.exec([
        'sh',
        '-c',
        'cat /x /tree/sub/f /alias; stat -c "%u" /n; stat -c "%h" /opt/lib/a; readlink /opt/lib/env; cat /opt/lib/b',
      ]);
      expect(seen.stdout).toBe('inside\ndeep\ninside\n65534\n2\n/usr/bin/env\nshared\n');
    });
  });

  describe('registry images', () => {
    let registry: TestRegistry;
    let authFile: string;

    beforeAll(async () => {
      registry = await TestRegistry.start(join(env.dataDir, 'registry'));
      authFile = await registry.authFile(join(env.dataDir, 'docker-config.json'));
    });

    afterAll(async () => {
      await registry?.stop();
    });

    async function push(name: string, top: TestTarEntry[]): Promise<void> {
      const layout = join(env.dataDir, `push-${count++}`);
      await writeOciLayout(layout, {
        layers: [
          [
            { path: 'etc/', type: 'dir' },
            { path: 'etc/base', data: 'base\n' },
          ],
          top,
        ],
        config: { Env: ['PATH=/bin'] },
      });
      await registry.push(layout, name, '1');
    }

    async function buildFrom(name: string): Promise<unknown> {
      const file = join(env.dataDir, `Dockerfile-${count++}`);
      await writeFile(file, `FROM ${registry.host}/${name}:1\nWORKDIR /work\n`);
      return env.platform.buildFromDockerfile({ file, name: `pulled-${count++}:1`, registry: { authFile } });
    }

    it('refuses an image whose layer links a host file or whites out the store', () =>
      attack('archive', 'registry image with the reported attacks', async () => {
        await push('evil/link', linkThrough(host));
        await push('evil/whiteout', [{ path: '.wh...' }]);
        for (const name of ['evil/link', 'evil/whiteout'])
          await refusedWithoutHarm(() => buildFrom(name), /is refused/, 'not_found');
      }));

    /** Every layer blob (not JSON) of the store's registry blob caches, wherever they are kept. */
    function cachedLayerBlobs(): string[] {
      const root = env.platform.store.root;
      const caches = [
        join(root, 'cache/oci-blobs/sha256'),
        ...readdirSync(join(root, 'projects')).map((p) =>
          join(root, 'projects', p, 'cache/oci-blobs/sha256'),
        ),
      ].filter((dir) => existsSync(dir));
      return caches.flatMap((dir) =>
        readdirSync(dir)
          .map((name) => join(dir, name))
          .filter((path) => {
            try {
              JSON.parse(readFileSync(path, 'utf8'));
              return false;
            } catch {
              return true;
            }
          }),
      );
    }

    it('never builds from a cached blob whose bytes do not match its digest', () =>
      attack('archive', 'registry blob cache poisoned under a digest', async () => {
        const top: TestTarEntry[] = [
          { path: 'opt/', type: 'dir' },
          { path: 'opt/real', data: 'real\n' },
        ];
        await push('cache/first', top);
        await buildFrom('cache/first');
        const poisoned = cachedLayerBlobs();
        expect(poisoned.length).toBeGreaterThan(0);
        for (const path of poisoned) await writeFile(path, tarArchive([{ path: 'poison', data: SECRET }]));
        // the same layers under another name: the cache holds them already
        await push('cache/second', top);
        const { environment } = (await buildFrom('cache/second')) as { environment: { layers: string[] } };
        const seen = await inLayers(environment.layers, (root) => ({
          poison: existsSync(join(root, 'poison')),
          real: readFileSync(join(root, 'opt/real'), 'utf8'),
        }));
        expect(seen).toEqual({ poison: false, real: 'real\n' });
      }));

    it('honest twin: an image with whiteouts, an opaque folder and hard links pulls and builds', async () => {
      await push('honest/tool', [
        { path: 'etc/.wh.base' },
        { path: 'opt/', type: 'dir' },
        { path: 'opt/.wh..wh..opq' },
        { path: 'opt/a', data: 'a\n' },
        { path: 'opt/b', type: 'hardlink', linkTarget: 'opt/a' },
      ]);
      const { environment } = (await buildFrom('honest/tool')) as { environment: { layers: string[] } };
      const seen = await inLayers(environment.layers, (root) => ({
        base: existsSync(join(root, 'etc/base')),
        a: readFileSync(join(root, 'opt/a'), 'utf8'),
        sameFile: statSync(join(root, 'opt/a')).ino === statSync(join(root, 'opt/b')).ino,
      }));
      expect(seen).toEqual({ base: false, a: 'a\n', sameFile: true });
    });
  });

  describe('honest archives of a real image', () => {
    const SUBSET = ['etc', 'usr/bin', 'usr/share/zoneinfo', 'usr/lib/python3'];

    it('keeps every file, link and hard link of Debian as GNU tar writes it (pax and GNU formats)', async () => {
      const debian = await env.platform.store.getEnvironment('debian:bookworm');
      for (const format of ['posix', 'gnu']) {
        const archive = join(env.dataDir, `debian-${format}.tar`);
        const expected = await env.platform.withLayerStack(debian.layers, async (root) => {
          await run('tar', [`--format=${format}`, '-C', root, '-cf', archive, ...SUBSET]);
          return treeSignature(root, SUBSET);
        });
        const layer = await buildLayerFromTar(env.platform.store, archive);
        const seen = await inLayers([layer.digest], (root) => treeSignature(root, SUBSET));
        expect(seen.size).toBeGreaterThan(2000);
        expect([...seen].filter(([path, value]) => expected.get(path) !== value)).toEqual([]);
        expect(seen.size).toBe(expected.size);
      }
    });

    it('flattens docker save output with whiteouts of real files, an opaque folder and a symlinked layer', async () => {
      const debian = await env.platform.store.getEnvironment('debian:bookworm');
      const base = join(env.dataDir, 'debian-base.tar');
      const expected = await env.platform.withLayerStack(debian.layers, async (root) => {
        await run('tar', ['--format=posix', '-C', root, '-cf', base, ...SUBSET]);
        return treeSignature(root, SUBSET);
      });
      const top = tarArchive([
        { path: 'etc/.wh.hostname' },
        { path: 'usr/share/zoneinfo/Etc/.wh..wh..opq' },
        { path: 'usr/share/zoneinfo/Etc/Mine', data: 'mine\n' },
        { path: 'opt/a', data: 'a\n' },
        { path: 'opt/b', type: 'hardlink', linkTarget: 'opt/a' },
      ]);
      // older docker save links a layer it already holds instead of storing it twice
      const image = await file(
        'debian-save.tar',
        tarArchive([
          {
            path: 'manifest.json',
            data: JSON.stringify([
              { Config: 'config.json', Layers: ['l0/layer.tar', 'l1/layer.tar', 'l2/layer.tar'] },
            ]),
          },
          { path: 'config.json', data: JSON.stringify({ config: { Env: ['PATH=/usr/bin:/bin'] } }) },
          { path: 'l0/layer.tar', data: readFileSync(base) },
          { path: 'l1/layer.tar', data: top },
          { path: 'l2/layer.tar', type: 'symlink', linkTarget: '../l1/layer.tar' },
        ]),
      );
      const { layer, config } = await buildLayerFromOci(env.platform.store, image);
      expect(config.env).toEqual({ PATH: '/usr/bin:/bin' });
      await inLayers([layer.digest], (root) => {
        expect(existsSync(join(root, 'etc/hostname'))).toBe(false);
        expect(readdirSync(join(root, 'usr/share/zoneinfo/Etc'))).toEqual(['Mine']);
        expect(statSync(join(root, 'opt/a')).ino).toBe(statSync(join(root, 'opt/b')).ino);
        const seen = treeSignature(root, ['usr/bin', 'etc/alternatives', 'usr/lib/python3']);
        expect([...seen].filter(([path, value]) => expected.get(path) !== value)).toEqual([]);
      });
    });
  });

  it('extracts 1,000 generated archives in both modes without a write, link or read outside the root', () =>
    attack('archive', 'generated archives (1,000, layer and apply)', async () => {
      const box = join(env.dataDir, 'fuzz');
      const canary = join(box, 'canary');
      await mkdir(join(canary, 'dir'), { recursive: true });
      await mkdir(join(box, 'roots'));
      await writeFile(join(canary, 'secret'), SECRET, { mode: 0o640 });
      await writeFile(join(canary, 'dir', 'inner'), SECRET);
      await symlink('secret', join(canary, 'link'));
      await writeFile(join(box, 'beside'), 'beside the roots');
      const random = seededRandom(0x5eed);
      const outcomes = { extracted: 0, refused: 0 };
      for (let i = 0; i < 1000; i++) {
        const entries = generateArchive(random, { box, secret: SECRET });
        const archive = tarArchive(entries);
        for (const mode of ['layer', 'apply'] as WhiteoutMode[]) {
          const root = join(box, 'roots', `r${i}-${mode}`);
          await mkdir(root);
          if (mode === 'apply') {
            // a lower image's files, one of them an absolute link out, as real images hold
            await mkdir(join(root, 'usr', 'lib'), { recursive: true });
            await writeFile(join(root, 'usr', 'lib', 'libc.so'), 'lower');
            await symlink('usr/lib', join(root, 'lib'));
            await symlink(canary, join(root, 'a'));
            await mkdir(join(root, 'd'));
            await writeFile(join(root, 'd', 'secret'), 'lower');
          }
          const before = fingerprint(box, root);
          const tree = await RootedTree.open(root, `archive ${i}`);
          const outcome: unknown = await extractTar(Readable.from([archive]), `archive ${i}`, tree, mode)
            .then(
              () => undefined,
              (e: unknown) => e,
            )
            .finally(() => tree.close());
          const after = fingerprint(box, root);
          const problems = [
            ...(outcome === undefined || isSandgymError(outcome, 'invalid_argument')
              ? []
              : [`failed with something other than a refusal: ${errorText(outcome)}`]),
            ...[...new Set([...before.keys(), ...after.keys()])]
              .filter((path) => before.get(path) !== after.get(path))
              .map(
                (path) =>
                  `${path} was ${!after.has(path) ? 'removed' : !before.has(path) ? 'created' : 'changed'}`,
              ),
            ...problemsInRoot(root, SECRET),
          ];
          expect(problems, `archive ${i} (${mode}): ${JSON.stringify(entries).slice(0, 2000)}`).toEqual([]);
          if (outcome === undefined) outcomes.extracted++;
          else outcomes.refused++;
          await rm(root, { recursive: true, force: true });
        }
      }
      // the archives must reach deep enough to matter: many extract, many are refused
      console.log(`generated archives: ${outcomes.extracted} extracted, ${outcomes.refused} refused`);
      expect(outcomes.extracted).toBeGreaterThan(300);
      expect(outcomes.refused).toBeGreaterThan(300);
    }));
  /**
   * Archives shaped to exhaust the node rather than escape: data claimed by entries that hold
   * none, quadratic headers, bombs, counts and depths without end. Each is refused naming the
   * archive and entry, within a bound on memory, and leaves nothing behind.
   */
  describe('archives that would exhaust the node', () => {
    const MiB = 2 ** 20;
    const pad = (size: number): Buffer => Buffer.alloc((512 - (size % 512)) % 512);

    /** Extracts a stream of chunks into a fresh folder; the outcome, and the folder. */
    async function extractInto(
      chunks: Iterable<Buffer> | AsyncIterable<Buffer>,
      mode: WhiteoutMode,
      limits?: Partial<ArchiveLimits>,
    ): Promise<{ error: unknown; root: string }> {
      const root = join(env.dataDir, `exhaust-${count++}`);
      await mkdir(root);
      const tree = await RootedTree.open(root, 'hostile.tar');
      const budget = new ArchiveBudget({ ...DEFAULT_ARCHIVE_LIMITS, ...limits });
      const error: unknown = await extractTar(Readable.from(chunks), 'hostile.tar', tree, mode, budget)
        .then(
          () => undefined,
          (e: unknown) => e,
        )
        .finally(() => tree.close());
      return { error, root };
    }

    function expectRefusal(error: unknown, message: RegExp): void {
      expect(isSandgymError(error, 'invalid_argument'), `expected a refusal, got ${String(error)}`).toBe(
        true,
      );
      expect(errorText(error)).toMatch(/hostile\.tar/);
      expect(errorText(error)).toMatch(message);
    }

    it('streams past the data of folders, links and devices instead of holding it', () =>
      attack('archive', 'data claimed by a non-file entry (memory)', async () => {
        const CLAIM = 512 * MiB;
        for (const [type, link] of [
          ['dir', ''],
          ['symlink', 'target'],
          ['hardlink', 'nothing'],
        ] as const) {
          let peak = 0;
          const base = process.memoryUsage().arrayBuffers;
          // eslint-disable-next-line @typescript-eslint/require-await -- an async source, as a stream is
          async function* archive(): AsyncGenerator<Buffer> {
            yield tarHeader(`big-${type}`, type, CLAIM, link);
            for (let sent = 0; sent < CLAIM; sent += MiB) {
              peak = Math.max(peak, process.memoryUsage().arrayBuffers - base);
              yield Buffer.alloc(MiB); // a new buffer each time, as a stream reads them
            }
            yield tarArchive([{ path: 'after', data: 'still read\n' }]);
          }
          const { error, root } = await extractInto(archive(), 'layer');
          // the hard link names no earlier file: refused, but only after its data was passed over
          if (type === 'hardlink') expectRefusal(error, /hard link target/);
          else {
            expect(error).toBeUndefined();
            expect(readFileSync(join(root, 'after'), 'utf8')).toBe('still read\n');
          }
          expect(peak, `${type}: bytes held while its data streamed past`).toBeLessThan(CLAIM / 4);
        }
      }));

    it('refuses pax headers that are malformed or pile up, in one pass', () =>
      attack('archive', 'quadratic pax headers (CPU, memory)', async () => {
        const entry = (records: Buffer): Buffer[] => [
          tarHeader('PaxHeader', 'x', records.length),
          records,
          pad(records.length),
          tarArchive([{ path: 'f', data: 'x' }]),
        ];
        // "2a2a2a…": every offset parses as a record of length 2 whose end is the header's end,
        // which made each record scan the rest of the header
        const quadratic = Buffer.from('2a'.repeat(256 * 1024));
        expectRefusal((await extractInto(entry(quadratic), 'layer')).error, /pax record .* malformed/);
        for (const bad of ['5 a=b', '4 ab\n', '99 a=b\n', 'x3 a=\n', '-1 a=b\n'])
          expectRefusal((await extractInto(entry(Buffer.from(bad)), 'layer')).error, /pax record/);
        // many headers before one entry, each within the bound, together far past it
        const piled: Buffer[] = [];
        for (let i = 0; i < 40; i++) {
          const records = Buffer.from(paxRecord(`SCHILY.xattr.user.k${i}`, 'v'.repeat(64 * 1024)));
          piled.push(tarHeader('PaxHeader', 'x', records.length), records, pad(records.length));
        }
        piled.push(...entry(Buffer.alloc(0)).slice(3));
        expectRefusal((await extractInto(piled, 'layer')).error, /headers of \d+ bytes before one entry/);
      }));

    it('honest twin: pax headers with many well-formed records extract', async () => {
      let records = '';
      for (let i = 0; i < 5000; i++) records += paxRecord(`SCHILY.xattr.user.k${i}`, `value ${i}`);
      records += paxRecord('path', 'dir/naïve name');
      // a file capability, as GNU tar writes Debian's ping: its value is binary, not UTF-8
      const capability = Buffer.from([0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0xff, 0xfe]);
      const body = Buffer.concat([
        Buffer.from(' SCHILY.xattr.security.capability='),
        capability,
        Buffer.from('\n'),
      ]);
      const binary = Buffer.concat([Buffer.from(String(body.length + 2)), body]);
      expect(binary.length).toBe(body.length + 2);
      const data = Buffer.concat([Buffer.from(records), binary]);
      const { error, root } = await extractInto(
        [
          tarHeader('PaxHeader', 'x', data.length),
          data,
          pad(data.length),
          tarArchive([{ path: 'ignored', data: 'ok\n' }]),
        ],
        'layer',
      );
      expect(error).toBeUndefined();
      expect(readFileSync(join(root, 'dir', 'naïve name'), 'utf8')).toBe('ok\n');
    });

    it('refuses a gzip bomb past the store quota, and keeps nothing of it', () =>
      attack('archive', 'gzip bomb (disk)', async () => {
        const store = env.platform.storeFor('bombs', 16 * MiB);
        const bomb = tarArchive([{ path: 'zeros', data: Buffer.alloc(64 * MiB) }], { gzip: true });
        const scratch = join(env.dataDir, 'store', 'tmp');
        const before = readdirSync(scratch).sort();
        for (const [surface, path] of [
          ['from-tar', await file('bomb.tar.gz', bomb)],
          ['from-oci', await file('bomb-image.tar', dockerSave({ data: bomb }))],
        ] as const) {
          const error: unknown = await (
            surface === 'from-tar' ? buildLayerFromTar(store, path) : buildLayerFromOci(store, path)
          ).then(
            () => undefined,
            (e: unknown) => e,
          );
          expect(isSandgymError(error, 'invalid_argument'), `${surface}: ${String(error)}`).toBe(true);
          expect(errorText(error)).toMatch(
            /entry "zeros" is refused: the archive unpacks to more than 16 MiB/,
          );
          expect(readdirSync(scratch).sort()).toEqual(before);
          expect(await store.listLayers()).toEqual([]);
        }
      }));

    it('honest twin: an archive within the quota unpacks', async () => {
      const store = env.platform.storeFor('within', 16 * MiB);
      const archive = tarArchive([{ path: 'data', data: randomBytes(4 * MiB) }], { gzip: true });
      const layer = await buildLayerFromTar(store, await file('within.tar.gz', archive));
      expect(layer.digest).toMatch(/^sha256:/);
    });

    it('refuses an archive of more entries or whiteouts than it may hold', () =>
      attack('archive', 'entries and whiteouts without end (inodes, time)', async () => {
        const many = (n: number, name: (i: number) => string): TestTarEntry[] =>
          Array.from({ length: n }, (_, i) => ({ path: name(i) }));
        expectRefusal(
          (await extractInto([tarArchive(many(1001, (i) => `f${i}`))], 'layer', { maxEntries: 1000 })).error,
          /entry "f1000" is refused: the archive holds more than 1000 entries/,
        );
        // entries skipped (the root folder, again and again) count as well
        expectRefusal(
          (await extractInto([tarArchive(many(1001, () => './'))], 'layer', { maxEntries: 1000 })).error,
          /more than 1000 entries/,
        );
        for (const mode of ['layer', 'apply'] as const)
          expectRefusal(
            (await extractInto([tarArchive(many(101, (i) => `d/.wh.f${i}`))], mode, { maxWhiteouts: 100 }))
              .error,
            /entry "d\/.wh.f100" is refused: the archive holds more than 100 whiteouts/,
          );
        // the node's own bounds hold for every surface
        expect(DEFAULT_ARCHIVE_LIMITS.maxEntries).toBeLessThanOrEqual(2_000_000);
        expect(DEFAULT_ARCHIVE_LIMITS.maxWhiteouts).toBeLessThanOrEqual(100_000);
      }));

    it('refuses folders nested past the bound on every surface, leaving nothing behind', () =>
      attack('archive', 'a very deep folder chain (descriptors, stack)', async () => {
        const deep = 'd/'.repeat(MAX_TREE_DEPTH + 1);
        for (const [name, entries] of [
          ['a file', [{ path: `${deep}f`, data: 'x' }]],
          ['folders', [{ path: deep, type: 'dir' }]],
          ['a whiteout', [{ path: `${deep}.wh.x` }]],
          ['a symlink', [{ path: `${deep}l`, type: 'symlink', linkTarget: 'x' }]],
        ] as [string, TestTarEntry[]][])
          for (const [surface, make] of Object.entries(SURFACES))
            await refusedWithoutHarm(() => make(entries), /folders deep/).catch((error: unknown) => {
              throw new Error(`${name} (${surface}): ${String(error)}`);
            });
        const scratch = readdirSync(join(env.dataDir, 'store', 'tmp')).filter((n) => n !== 'another-build');
        expect(scratch).toEqual([]);
      }));

    it('honest twin: a tree nested to the bound unpacks', async () => {
      const deep = 'd/'.repeat(MAX_TREE_DEPTH - 1);
      const { error, root } = await extractInto(
        [tarArchive([{ path: `${deep}f`, data: 'deep\n' }])],
        'layer',
      );
      expect(error).toBeUndefined();
      expect(readFileSync(join(root, deep, 'f'), 'utf8')).toBe('deep\n');
    });

    it('refuses an image of more layers than overlayfs stacks, and unpacks a repeated layer once', () =>
      attack('archive', 'many or repeated layers (work)', async () => {
        const image = (layers: number, distinct: boolean): Buffer =>
          tarArchive([
            {
              path: 'manifest.json',
              data: JSON.stringify([
                {
                  Config: 'config.json',
                  Layers: Array.from({ length: layers }, (_, i) => `l${distinct ? i : 0}/layer.tar`),
                },
              ]),
            },
            { path: 'config.json', data: '{"config":{}}' },
            ...Array.from({ length: distinct ? layers : 1 }, (_, i) => ({
              path: `l${i}/layer.tar`,
              data: tarArchive([{ path: `f${i}`, data: `${i}\n` }]),
            })),
          ]);
        await refusedWithoutHarm(
          async () =>
            buildLayerFromOci(env.platform.store, await file('tall.tar', image(MAX_IMAGE_LAYERS + 1, true))),
          /has 129 layers; at most 128/,
        );
        await refusedWithoutHarm(
          async () => buildLayerFromOci(env.platform.store, await file('repeated.tar', image(5000, false))),
          /has 5000 layers/,
        );
      }));

    it('refuses names that are not UTF-8 rather than letting two collide', () =>
      attack('archive', 'non-UTF-8 names colliding after decoding', async () => {
        // two byte-different Latin-1 names, both decoded as "caf\ufffd" by a lossy decoder
        const entries = (name: Buffer, data: string): Buffer[] => [
          tarHeader(name, 'file', data.length),
          Buffer.from(data),
          pad(data.length),
        ];
        const archive = [
          ...entries(Buffer.from([0x63, 0x61, 0x66, 0xe9]), 'first'),
          ...entries(Buffer.from([0x63, 0x61, 0x66, 0xe8]), 'second'),
          Buffer.alloc(1024),
        ];
        for (const mode of ['layer', 'apply'] as const) {
          const { error, root } = await extractInto(archive, mode);
          expectRefusal(error, /entry "caf\ufffd" is refused: the name .* is not valid UTF-8/);
          expect(readdirSync(root)).toEqual([]);
        }
      }));

    it('refuses sparse files, which it would unpack wrong', () =>
      attack('archive', 'sparse files (GNU 0.0, 0.1, 1.0, old GNU)', async () => {
        const sparse = (records: string): Buffer[] => {
          const data = Buffer.from(records);
          return [
            tarHeader('PaxHeader', 'x', data.length),
            data,
            pad(data.length),
            tarArchive([{ path: 'GNUSparseFile.0/f', data: '1\n0\n4\nabcd' }]),
          ];
        };
        for (const records of [
          paxRecord('GNU.sparse.size', '1048576') +
            paxRecord('GNU.sparse.numblocks', '1') +
            paxRecord('GNU.sparse.offset', '0') +
            paxRecord('GNU.sparse.numbytes', '4'),
          paxRecord('GNU.sparse.size', '1048576') + paxRecord('GNU.sparse.map', '0,4'),
          paxRecord('GNU.sparse.major', '1') +
            paxRecord('GNU.sparse.minor', '0') +
            paxRecord('GNU.sparse.name', 'f') +
            paxRecord('GNU.sparse.realsize', '1048576'),
        ])
          expectRefusal(
            (await extractInto(sparse(records), 'layer')).error,
            /sparse files are not supported/,
          );
        expectRefusal(
          (await extractInto([tarHeader('f', 'S', 0), Buffer.alloc(1024)], 'layer')).error,
          /unsupported tar type "S" \(a GNU sparse file\)/,
        );
      }));

    it('reads absolute names beneath the root, and zstd layers, as Docker does', () =>
      attack('archive', 'absolute names and zstd layers read unlike Docker', async () => {
        const entries: TestTarEntry[] = [
          { path: '/etc/abs', data: 'abs\n' },
          { path: '//opt//x', data: 'x\n' },
          { path: '/etc/hard', type: 'hardlink', linkTarget: '/etc/abs' },
        ];
        for (const mode of ['layer', 'apply'] as const) {
          const { error, root } = await extractInto([tarArchive(entries)], mode);
          expect(error).toBeUndefined();
          expect(readFileSync(join(root, 'etc/abs'), 'utf8')).toBe('abs\n');
          expect(readFileSync(join(root, 'opt/x'), 'utf8')).toBe('x\n');
          expect(statSync(join(root, 'etc/hard')).ino).toBe(statSync(join(root, 'etc/abs')).ino);
        }
        const plain = await file('zstd-layer.tar', tarArchive([{ path: 'etc/z', data: 'zstd\n' }]));
        await run('zstd', ['-q', '-f', plain, '-o', `${plain}.zst`]);
        const { layer } = await buildLayerFromOci(
          env.platform.store,
          await file('zstd-image.tar', dockerSave({ data: readFileSync(`${plain}.zst`) })),
        );
        await inLayers([layer.digest], (root) =>
          expect(readFileSync(join(root, 'etc/z'), 'utf8')).toBe('zstd\n'),
        );
        // a corrupt zstd layer is an error, never a shorter archive
        const corrupt = readFileSync(`${plain}.zst`);
        corrupt.writeUInt32LE(0xdeadbeef, corrupt.length - 8);
        await refusedWithoutHarm(
          async () =>
            buildLayerFromOci(env.platform.store, await file('zstd-bad.tar', dockerSave({ data: corrupt }))),
          /zstd|truncated|corrupt/,
        );
      }));

    it("follows a lower layer's symlinks inside the root when an image is flattened, as Docker does", () =>
      attack('archive', "an upper layer's entry under a lower layer's symlink", async () => {
        const lower = tarArchive([
          { path: 'usr/lib/old', data: 'old\n' },
          { path: 'usr/bin/', type: 'dir' },
          { path: 'lib', type: 'symlink', linkTarget: 'usr/lib' },
          { path: 'bin', type: 'symlink', linkTarget: '/usr/bin' },
          // links out of the root, as an image may hold: followed, they stay inside it
          { path: 'out', type: 'symlink', linkTarget: host },
          { path: `${host.slice(1)}/`, type: 'dir' },
          { path: 'up', type: 'symlink', linkTarget: '../../../..' },
        ]);
        const upper = tarArchive([
          { path: 'lib/x', data: 'x\n' },
          { path: 'lib/.wh.old' },
          { path: 'lib/y', type: 'hardlink', linkTarget: 'lib/x' },
          { path: 'bin/tool', data: 'tool\n' },
          { path: 'out/planted', data: 'planted\n' },
          { path: 'up/etc/escaped', data: 'escaped\n' },
        ]);
        const image = await file(
          'lower-links.tar',
          tarArchive([
            {
              path: 'manifest.json',
              data: JSON.stringify([{ Config: 'config.json', Layers: ['l0/layer.tar', 'l1/layer.tar'] }]),
            },
            { path: 'config.json', data: '{"config":{}}' },
            { path: 'l0/layer.tar', data: lower },
            { path: 'l1/layer.tar', data: upper },
          ]),
        );
        const before = fingerprint(host, '');
        const { layer } = await buildLayerFromOci(env.platform.store, image);
        expect(fingerprint(host, '')).toEqual(before);
        await inLayers([layer.digest], (root) => {
          expect(readlinkSync(join(root, 'lib'))).toBe('usr/lib');
          expect(readlinkSync(join(root, 'bin'))).toBe('/usr/bin');
          expect(readdirSync(join(root, 'usr/lib')).sort()).toEqual(['x', 'y']);
          expect(statSync(join(root, 'usr/lib/y')).ino).toBe(statSync(join(root, 'usr/lib/x')).ino);
          expect(readFileSync(join(root, 'usr/bin/tool'), 'utf8')).toBe('tool\n');
          expect(readFileSync(join(root, host, 'planted'), 'utf8')).toBe('planted\n');
          expect(readFileSync(join(root, 'etc/escaped'), 'utf8')).toBe('escaped\n');
        });
      }));

    it('honest twin: an image repeating its empty layer builds', async () => {
      const empty = tarArchive([]);
      const { layer } = await buildLayerFromOci(
        env.platform.store,
        await file(
          'empty-layers.tar',
          tarArchive([
            {
              path: 'manifest.json',
              data: JSON.stringify([
                {
                  Config: 'config.json',
                  Layers: ['base/layer.tar', ...Array.from({ length: 20 }, () => 'empty/layer.tar')],
                },
              ]),
            },
            { path: 'config.json', data: '{"config":{}}' },
            { path: 'base/layer.tar', data: tarArchive([{ path: 'etc/base', data: 'base\n' }]) },
            { path: 'empty/layer.tar', data: empty },
          ]),
        ),
      );
      await inLayers([layer.digest], (root) =>
        expect(readFileSync(join(root, 'etc/base'), 'utf8')).toBe('base\n'),
      );
    });
  });
});

/**
 * The store's scratch folders: a build's tree has every folder's times set to 0 (as an image
 * wants), and an archive can make a tree deeper than any path the kernel takes. Collection must
 * never take a build in progress for leftovers, and must still remove leftovers however deep.
 */
describe('store scratch under attack', () => {
  let env: TestPlatform;
  /** Names longer than any path the kernel takes, once joined under the store. */
  const DEEP = Array.from({ length: 16 }, (_, i) => `${i}`.padEnd(250, 'd')).join('/');

  beforeAll(async () => {
    env = await createTestPlatform('hostile-scratch', { privateStore: true });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  const collect = () =>
    env.platform.store.layers.collectGarbage({ minAgeMs: 0, pinned: new Set(), sweepScratch: true });

  it('never collects a build in progress whose folder times are 0', () =>
    attack('archive', 'gc of a build whose tree times were set to 0', async () => {
      const dir = await env.platform.store.scratch('inuse');
      await writeFile(join(dir, 'f'), 'x');
      await withRootedTree(dir, 'test', (tree) => normaliseFolderTimes(tree));
      expect(statSync(dir).mtimeMs).toBe(0);
      await collect();
      expect(existsSync(join(dir, 'f'))).toBe(true);
      await env.platform.store.removeScratch(dir);
      expect(existsSync(dir)).toBe(false);
    }));

  it('removes a tree deeper than PATH_MAX, in a build that fails and in collection', () =>
    attack('archive', 'scratch deeper than PATH_MAX', async () => {
      const tmp = join(env.platform.store.root, 'tmp');
      const before = new Set(readdirSync(tmp));
      const archive = join(env.dataDir, 'deep.tar');
      await writeFile(archive, tarArchive([{ path: `${DEEP}/f`, data: 'deep' }]));
      // the build may keep or refuse the tree; either way its scratch goes
      await buildLayerFromTar(env.platform.store, archive).catch(() => undefined);
      expect(readdirSync(tmp).filter((name) => !before.has(name))).toEqual([]);
      // a crashed writer's deep leftovers: its marker an hour and more old
      const dir = await env.platform.store.scratch('crashed');
      await withRootedTree(dir, 'test', (tree) => tree.makeFolder(DEEP));
      const old = new Date(Date.now() - 2 * 60 * 60_000);
      await utimes(`${dir}.live`, old, old);
      await collect();
      expect(existsSync(dir)).toBe(false);
      expect(readdirSync(tmp).filter((name) => !before.has(name))).toEqual([]);
    }));
});
