import { createHash } from 'node:crypto';
import type { Stats } from 'node:fs';
import { chmod, lchown, mkdir, realpath, utimes } from 'node:fs/promises';
import { basename, dirname, join, posix, relative, resolve } from 'node:path';
import { recordText, type BackendSandbox } from '../../backends/index.ts';
import { SandgymError, isSandgymError, readRegularFile, resolveBeneath } from '../../common/index.ts';
import type { Environment, ImageMetadata, ProjectStore } from '../store/layer-store.ts';
import { standInFor } from '../store/base-environments.ts';
import { BuildContext } from './build-context.ts';
import { pullImage, type RegistryOptions } from './from-registry.ts';
import { parseImageReference, type ImageReference } from './image-reference.ts';
import {
  expandVariables,
  keyValues,
  parseDockerfile,
  splitWords,
  type Command,
  type DockerInstruction,
  type Heredoc,
} from './dockerfile-parse.ts';
import { withRootedTree, type RootedTree } from './rooted-tree.ts';
import { storeBudget } from './tar-extract.ts';
import { copyIntoTree, type TreeSource } from './tree-copy.ts';

/** What the builder needs from the platform. */
export interface BuildHost {
  readonly store: ProjectStore;
  /** A sandbox on an explicit layer stack, reaching what the named network rules allow. */
  createSandboxFromLayers(
    layers: string[],
    config: Environment['config'],
    options?: { network?: string[] },
  ): Promise<BackendSandbox>;
  /** Hands `consume` a read-only view of a layer stack's merged tree on this host. */
  withLayerStack<T>(layers: readonly string[], consume: (root: string) => Promise<T>): Promise<T>;
  /** The network rules RUN steps get unless a build names its own: the node's package mirrors. */
  readonly defaultBuildNetwork: readonly string[];
}

/** Options for {@link buildFromDockerfile}. */
export interface DockerfileBuildOptions {
  file: string;
  /** Folder COPY and ADD read from; default: the Dockerfile's folder. */
  context?: string;
  /**
   * The folder the Dockerfile and the context must lie beneath, symlinks followed (a task's
   * folder, which its author wrote): one that leads out is refused, never read. Without it the
   * Dockerfile is the caller's own and only the context's files are confined to the context.
   */
  root?: string;
  /** The environment to record, "name:version". */
  name: string;
  /** Called as each step finishes, for progress. */
  onStep?: (step: BuildStep) => void;
  /**
   * The environment to start from when FROM names an image that is not in the store (a task's
   * `FROM ubuntu:22.04`, say). Without it such a FROM is an error.
   */
  fromFallback?: string;
  /** How FROM pulls images the store lacks: credentials, plain-HTTP registries. */
  registry?: RegistryOptions;
  /** `--build-arg NAME=value`: values for the Dockerfile's ARGs. */
  buildArgs?: Readonly<Record<string, string>>;
  /** The stage to build (its `AS` name); default the last. */
  target?: string;
  /**
   * The network rules RUN steps may reach (`mirror:debian`, `host:IP:PORT`); default the node's
   * package mirrors (its rule book's `mirror:*` rules, and `dns`).
   */
  network?: readonly string[];
  /**
   * How long the whole build may take (Harbor's `build_timeout_sec`); each RUN step gets what is
   * left, and one that runs past it fails the build naming its line. Default: no limit.
   */
  timeoutMs?: number;
}

/** How one instruction went. */
export interface BuildStep {
  line: number;
  instruction: string;
  /** `cached`: its layer came from an earlier build; `built`: it ran now; `config`: no layer. */
  outcome: 'cached' | 'built' | 'config';
  layer?: string;
}

export interface DockerfileBuildResult {
  environment: Environment;
  steps: BuildStep[];
  /** What the build decided that the user should know, e.g. a FROM that was mapped. */
  notes: string[];
}

/** A stage's state as its instructions run. */
interface Stage {
  layers: string[];
  config: Environment['config'];
  image: ImageMetadata;
  /** ARGs in scope: the stage's own declarations, with their values. */
  args: Record<string, string>;
  shell: string[];
  key: string;
}

/** The platforms FROM --platform may name: the machine's own. */
const OWN_PLATFORMS = new Set([
  'linux/amd64',
  'linux/x86_64',
  'linux/amd64/v1',
  'linux/amd64/v2',
  'linux/amd64/v3',
]);
const DEFAULT_SHELL = ['/bin/sh', '-c'];
/** The most of a stage's /etc/passwd or /etc/group read for --chown. */
const MAX_ACCOUNTS_BYTES = 16 * 2 ** 20;
/** The PATH of a sandbox whose environment sets none (as OCI images and the agent have it). */
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** ARGs Docker predefines: the build's and the target's platform. */
const PLATFORM_ARGS: Record<string, string> = {
  BUILDPLATFORM: 'linux/amd64',
  TARGETPLATFORM: 'linux/amd64',
  BUILDOS: 'linux',
  TARGETOS: 'linux',
  BUILDARCH: 'amd64',
  TARGETARCH: 'amd64',
};

function hash(...parts: unknown[]): string {
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex');
}

/**
 * Builds an environment from a Dockerfile without a Docker engine: RUN steps run in our own
 * container backend (reaching the build's network rules) and each step's writable layer becomes
 * a layer; COPY and ADD become layers of their own; config and metadata instructions change the
 * environment's config and image metadata. Multi-stage builds, ARG scoping, here-documents and
 * `.dockerignore` work as in `docker build`. Each step is cached by a key chained from its
 * parent's key, the instruction, the config it runs under and (for COPY/ADD) the content it
 * takes. Every error names the file and line.
 */
export async function buildFromDockerfile(
  host: BuildHost,
  options: DockerfileBuildOptions,
): Promise<DockerfileBuildResult> {
  const notes: string[] = [];
  try {
    return await buildNoting(host, options, notes);
  } catch (error) {
    // what the build noted on its way (a base image replaced by the store's) often explains why
    // a later step failed: "Unable to locate package" from Debian where the Dockerfile said Ubuntu
    if (notes.length === 0 || !isSandgymError(error)) throw error;
    throw new SandgymError(error.code, `${error.message} (build notes: ${notes.join('; ')})`, {
      cause: error,
      retryable: error.retryable,
    });
  }
}

/** {@link buildFromDockerfile}, writing what it notes into `notes` as it goes. */
async function buildNoting(
  host: BuildHost,
  options: DockerfileBuildOptions,
  notes: string[],
): Promise<DockerfileBuildResult> {
  // errors name the Dockerfile as the caller named it, never where a symlink led
  const file = resolve(options.file);
  const contextDir = resolve(options.context ?? dirname(file));
  const within = (path: string, what: string): Promise<string> =>
    options.root === undefined ? realpath(path).catch(() => path) : resolveBeneath(options.root, path, what);
  const text = (await readRegularFile(
    await within(file, 'The Dockerfile'),
    `The Dockerfile ${file}`,
  ))!.toString('utf8');
  const { instructions, escape } = parseDockerfile(text, file);
  const context = await BuildContext.open(await within(contextDir, 'The build context'));
  const buildArgs = options.buildArgs ?? {};
  const run: RunSettings = {
    network: [...(options.network ?? host.defaultBuildNetwork)],
    notes,
    ...(options.timeoutMs === undefined
      ? {}
      : { deadlineAt: Date.now() + options.timeoutMs, timeoutMs: options.timeoutMs }),
  };
  // the build's deadline covers every step: pulls (FROM, COPY --from an image) and ADD's unpacking
  // stop at it as RUN does, so no slow registry or archive stalls a build past its limit
  const registry: RegistryOptions = {
    ...options.registry,
    ...(run.deadlineAt === undefined ? {} : { deadlineAt: run.deadlineAt }),
  };
  const stepOptions = { ...options, registry };
  const steps: BuildStep[] = [];
  const record = (step: BuildStep): void => {
    steps.push(step);
    options.onStep?.(step);
  };
  const stages = new Map<string, Stage>();
  const finished: Stage[] = [];
  // ARGs before the first FROM: in scope for FROM lines, and declarable again inside a stage
  const globalArgs: Record<string, string> = { ...PLATFORM_ARGS };
  let stage: Stage | undefined;
  let stageName: string | undefined;
  const finishStage = (): void => {
    if (!stage) return;
    finished.push(stage);
    // names and indexes apart: a name that looked like an index would shadow another stage
    if (stageName) stages.set(stageName, stage);
  };

  for (const instruction of instructions) {
    const line = instruction.line;
    const where = `${file} line ${line}`;
    if (run.deadlineAt !== undefined && Date.now() > run.deadlineAt)
      throw new SandgymError(
        'failed_precondition',
        `${where}: not started: the build ran past its time limit of ${Math.round((run.timeoutMs ?? 0) / 1000)} s`,
      );
    if (instruction.kind === 'FROM') {
      finishStage();
      // Docker's rule (names are lower-cased by the parser): a letter first, so a name is never
      // read as an index, and each name once
      if (instruction.stage !== undefined && !STAGE_NAME.test(instruction.stage))
        throw new SandgymError(
          'invalid_argument',
          `${where}: "${instruction.stage}" is no stage name: it must start with a letter, then letters, digits, "-", "_" or "."`,
        );
      if (instruction.stage !== undefined && stages.has(instruction.stage))
        throw new SandgymError(
          'invalid_argument',
          `${where}: a stage is already named "${instruction.stage}"`,
        );
      stage = await startStage(host, instruction, {
        globalArgs,
        stages,
        options: stepOptions,
        where,
        notes,
        escape,
      });
      stageName = instruction.stage;
      record({ line, instruction: instruction.text, outcome: 'config' });
      continue;
    }
    if (!stage) {
      // only ARG may come before the first FROM (the parser made sure)
      if (instruction.kind === 'ARG') {
        const value = buildArgs[instruction.name] ?? expandOptional(instruction.value, globalArgs, escape);
        if (value !== undefined) globalArgs[instruction.name] = value;
      }
      continue;
    }
    // an image's PATH is the default one unless it set its own (`ENV PATH=/x:$PATH` builds on it)
    const vars = { PATH: DEFAULT_PATH, ...stage.args, ...stage.config.env };
    const expand = (value: string): string => expandVariables(value, vars, escape);
    switch (instruction.kind) {
      case 'ARG': {
        const value =
          buildArgs[instruction.name] ??
          expandOptional(instruction.value, vars, escape) ??
          globalArgs[instruction.name];
        if (value !== undefined) stage.args[instruction.name] = value;
        stage.key = hash(stage.key, 'ARG', instruction.name, value ?? null);
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      }
      case 'ENV':
      case 'LABEL': {
        const pairs = keyValues(file, line, instruction.kind, expand(instruction.raw), escape);
        for (const [key, value] of pairs) {
          if (instruction.kind === 'ENV') stage.config.env[key] = value;
          else stage.image.labels[key] = value;
        }
        if (instruction.kind === 'ENV') stage.key = hash(stage.key, 'ENV', pairs);
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      }
      case 'USER':
        stage.config.user = expand(instruction.user).trim();
        stage.key = hash(stage.key, 'USER', stage.config.user);
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      case 'SHELL':
        stage.shell = instruction.argv;
        stage.image.shell = instruction.argv;
        stage.key = hash(stage.key, 'SHELL', instruction.argv);
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      case 'CMD':
      case 'ENTRYPOINT': {
        const argv = commandArgv(instruction.command, stage.shell);
        if (instruction.kind === 'CMD') stage.image.cmd = argv;
        else stage.image.entrypoint = argv;
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      }
      case 'EXPOSE':
      case 'VOLUME': {
        const values = instruction.raw.startsWith('[')
          ? (JSON.parse(instruction.raw) as string[])
          : splitWords(expand(instruction.raw), escape);
        if (instruction.kind === 'EXPOSE') stage.image.exposedPorts.push(...values);
        else stage.image.volumes.push(...values);
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      }
      case 'HEALTHCHECK':
        stage.image.healthcheck = instruction.raw;
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      case 'STOPSIGNAL':
        stage.image.stopSignal = expand(instruction.raw);
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      case 'ONBUILD':
        stage.image.onbuild = [...(stage.image.onbuild ?? []), instruction.raw];
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      case 'MAINTAINER':
        stage.image.labels['maintainer'] = instruction.raw;
        record({ line, instruction: instruction.text, outcome: 'config' });
        continue;
      case 'WORKDIR':
      case 'RUN':
      case 'COPY':
      case 'ADD': {
        // WORKDIR makes its folder, as Docker does, so commands can start in it
        if (instruction.kind === 'WORKDIR')
          stage.config.workdir = posix.resolve(stage.config.workdir, expand(instruction.path));
        const sources: CopySources = {
          // --from names a stage by its name, else by its index (Docker's order), else an image
          stage: (name) => stages.get(name) ?? (/^\d+$/.test(name) ? finished[Number(name)] : undefined),
          // COPY --from an image: from the store or its registry; a fallback makes no sense here
          image: (name, at) => resolveBaseImage(host.store, name, { registry }, at, notes),
        };
        const plan = await planStep(host, instruction, stage, sources, context, run, { file, line }, expand);
        stage.key = hash(stage.key, instruction.text, stage.config, plan.key);
        const cached = await host.store.cachedStep(stage.key);
        const layer = cached ?? (await plan.build());
        if (!cached) await host.store.cacheStep(stage.key, layer);
        stage.layers.push(layer);
        record({ line, instruction: instruction.text, outcome: cached ? 'cached' : 'built', layer });
        continue;
      }
    }
  }
  finishStage();
  const target =
    options.target === undefined ? finished[finished.length - 1] : stages.get(options.target.toLowerCase());
  if (!target) {
    throw new SandgymError(
      'invalid_argument',
      `${file}: no stage named "${options.target}" (stages: ${[...stages.keys()].join(', ') || 'unnamed'})`,
    );
  }
  if (target.layers.length === 0)
    throw new SandgymError(
      'invalid_argument',
      `${file}: the stage built is empty (FROM scratch and nothing added)`,
    );
  const [name = '', version = 'latest'] = options.name.split(':');
  const environment = await host.store.putEnvironment({
    name,
    version,
    layers: target.layers,
    config: target.config,
    image: target.image,
    description: `built from ${file}`,
  });
  return { environment, steps, notes };
}

function expandOptional(
  value: string | undefined,
  vars: Record<string, string>,
  escape: string,
): string | undefined {
  return value === undefined ? undefined : expandVariables(value, vars, escape);
}

/** A CMD/ENTRYPOINT/RUN command as argv: the exec form as written, the shell form under the shell. */
function commandArgv(command: Command, shell: readonly string[]): string[] {
  return command.form === 'exec' ? command.argv : [...shell, command.text];
}

/** A stage name Docker accepts (after lower-casing). */
const STAGE_NAME = /^[a-z][a-z0-9._-]*$/;

/** What a stage's start needs from the build around it. */
interface StageStart {
  globalArgs: Record<string, string>;
  stages: ReadonlyMap<string, Stage>;
  options: DockerfileBuildOptions;
  where: string;
  notes: string[];
  escape: string;
}

/**
 * A stage's start: FROM an earlier stage, scratch, an environment in the store, an image pulled
 * from its registry, or (only when the build asked for one) the fallback base.
 */
async function startStage(
  host: BuildHost,
  from: Extract<DockerInstruction, { kind: 'FROM' }>,
  { globalArgs, stages, options, where, notes, escape }: StageStart,
): Promise<Stage> {
  const image = expandVariables(from.image, globalArgs, escape);
  if (from.platform !== undefined) {
    const platform = expandVariables(from.platform, globalArgs, escape).toLowerCase();
    if (!OWN_PLATFORMS.has(platform))
      throw new SandgymError(
        'invalid_argument',
        `${where}: FROM --platform=${platform}: only linux/amd64 builds here`,
      );
  }
  const fresh = (base: {
    layers: string[];
    config: Environment['config'];
    image?: ImageMetadata | undefined;
  }): Stage => ({
    layers: [...base.layers],
    config: { env: { ...base.config.env }, workdir: base.config.workdir, user: base.config.user },
    image: copyMetadata(base.image),
    args: {},
    shell: base.image?.shell ?? DEFAULT_SHELL,
    key: hash('FROM', base.layers, base.config),
  });
  if (image === 'scratch') return fresh({ layers: [], config: { env: {}, workdir: '/', user: 'root' } });
  const earlier = stages.get(image.toLowerCase());
  if (earlier) return fresh(earlier);
  return fresh(await resolveBaseImage(host.store, image, options, where, notes));
}

/**
 * An image by reference, as FROM finds it (the store, then its registry, then the fallback if one
 * is given); `notes` say which it was.
 */
export async function resolveImage(
  store: ProjectStore,
  image: string,
  options: Pick<DockerfileBuildOptions, 'registry' | 'fromFallback'>,
): Promise<{ environment: Environment; notes: string[] }> {
  const notes: string[] = [];
  const environment = await resolveBaseImage(store, image, options, `image ${image}`, notes);
  return { environment, notes };
}

/** FROM's image: the store, then its registry, then the fallback the build asked for, else an error. */
async function resolveBaseImage(
  store: ProjectStore,
  image: string,
  options: Pick<DockerfileBuildOptions, 'registry' | 'fromFallback'>,
  where: string,
  notes: string[],
): Promise<Environment> {
  let ref: ImageReference;
  try {
    ref = parseImageReference(image);
  } catch (error) {
    throw new SandgymError('invalid_argument', `${where}: FROM ${image}: ${(error as Error).message}`);
  }
  const stored = storedBaseImage(store, ref);
  if (stored) {
    if (stored !== ref.familiar) notes.push(`FROM ${image}: the store's ${stored}, the same Debian release`);
    return store.getEnvironment(stored);
  }
  let pullFailure: unknown;
  try {
    const pulled = await pullImage(store, ref, options.registry);
    notes.push(
      `FROM ${image}: ${pulled.digest} ${pulled.cached ? 'already pulled' : `pulled from ${ref.registry}`}`,
    );
    return pulled.environment;
  } catch (error) {
    pullFailure = error;
  }
  const why = pullFailure instanceof Error ? pullFailure.message : String(pullFailure);
  if (!options.fromFallback) {
    throw new SandgymError(
      'not_found',
      `${where}: FROM ${image}: not in the store and not pulled (${why}). Build or import it into the store, make its registry reachable, or name a fallback base to build on instead (--fallback-base ENV)`,
      { cause: pullFailure },
    );
  }
  notes.push(
    `FROM ${image}: not in the store and not pulled (${why}); built on ${options.fromFallback} instead, as asked`,
  );
  return store.getEnvironment(options.fromFallback);
}

/** The store environment a reference names, directly or by a Debian tag the store's image is. */
function storedBaseImage(store: ProjectStore, ref: ImageReference): string | undefined {
  if (ref.digest || ref.registry !== 'docker.io') return undefined;
  if (store.hasEnvironment(ref.familiar)) return ref.familiar;
  const alias = standInFor(ref.familiar);
  return alias && store.hasEnvironment(alias) ? alias : undefined;
}

function copyMetadata(image: ImageMetadata | undefined): ImageMetadata {
  return {
    labels: { ...image?.labels },
    exposedPorts: [...(image?.exposedPorts ?? [])],
    volumes: [...(image?.volumes ?? [])],
    ...(image?.cmd ? { cmd: [...image.cmd] } : {}),
    ...(image?.entrypoint ? { entrypoint: [...image.entrypoint] } : {}),
    ...(image?.healthcheck ? { healthcheck: image.healthcheck } : {}),
    ...(image?.stopSignal ? { stopSignal: image.stopSignal } : {}),
    ...(image?.shell ? { shell: [...image.shell] } : {}),
  };
}

/** A step's cache key part (what it reads beyond the instruction) and how to build its layer. */
interface StepPlan {
  key: unknown;
  build(): Promise<string>;
}

/** What RUN steps run with: the build's network rules and its deadline. */
interface RunSettings {
  network: string[];
  /** The build's notes: a step that succeeds though its network refused it something says so. */
  notes?: string[];
  deadlineAt?: number;
  timeoutMs?: number;
}

/** What COPY --from may name: an earlier stage, or an image. */
interface CopySources {
  stage: (name: string) => Stage | undefined;
  image: (name: string, where: string) => Promise<Environment>;
}

async function planStep(
  host: BuildHost,
  instruction: Extract<DockerInstruction, { kind: 'WORKDIR' | 'RUN' | 'COPY' | 'ADD' }>,
  stage: Stage,
  sources: CopySources,
  context: BuildContext,
  run: RunSettings,
  at: { file: string; line: number },
  expand: (value: string) => string,
): Promise<StepPlan> {
  const where = `${at.file} line ${at.line}`;
  const layers = [...stage.layers];
  const config = { env: { ...stage.config.env }, workdir: stage.config.workdir, user: stage.config.user };
  switch (instruction.kind) {
    case 'WORKDIR':
      // the key names the recipe: layers of the older one (a root-owned mkdir) are not reused
      return {
        key: { folder: 'keeps-existing' },
        build: () => folderStep(host, layers, config.workdir, where),
      };
    case 'RUN': {
      const argv = runArgv(instruction, stage.shell);
      const env = { ...stage.args, ...config.env };
      const rules = runNetwork(instruction.flags, run.network, where);
      return {
        key: { argv, env, rules },
        build: () => runStep(host, layers, { ...config, env }, argv, { ...run, network: rules }, where),
      };
    }
    case 'COPY':
    case 'ADD':
      return copyPlan(host, instruction, stage, sources, context, at, expand, run.deadlineAt);
  }
}

/**
 * RUN's argv: the exec form; the shell form under SHELL; `RUN <<EOF` alone runs the document as
 * the shell's script, and `RUN python3 <<EOF` gives it to the command on stdin, as the shell would
 * (which also expands, or not, what an unquoted marker would). ARGs and ENV reach it as its
 * environment, so the shell expands them, as in Docker.
 */
function runArgv(run: Extract<DockerInstruction, { kind: 'RUN' }>, shell: readonly string[]): string[] {
  const [heredoc] = run.heredocs;
  if (!heredoc) return commandArgv(run.command, shell);
  const line = run.command.form === 'shell' ? run.command.text : '';
  if (line.replace(/<<-?["']?[A-Za-z_][A-Za-z0-9_]*["']?/g, '').trim() === '')
    return [...shell, heredoc.body];
  const documents = run.heredocs.map((doc) => `${doc.body}${doc.name}\n`).join('');
  return [...shell, `${line}\n${documents}`];
}

/** The network rules a RUN step gets: the build's, or none with `--network=none`. */
function runNetwork(
  flags: Extract<DockerInstruction, { kind: 'RUN' }>['flags'],
  rules: string[],
  where: string,
): string[] {
  for (const mount of typeof flags['mount'] === 'string' ? flags['mount'].split('\n') : []) {
    const type = /(?:^|,)type=([a-z]+)/.exec(mount)?.[1] ?? 'bind';
    // a cache or tmpfs mount only speeds a build up: the step runs the same without it
    if (type !== 'cache' && type !== 'tmpfs')
      throw new SandgymError(
        'invalid_argument',
        `${where}: RUN --mount=type=${type} is not supported (cache and tmpfs are)`,
      );
  }
  const wanted = flags['network'];
  if (wanted === undefined || wanted === 'default') return rules;
  if (wanted === 'none') return [];
  throw new SandgymError(
    'invalid_argument',
    `${where}: RUN --network=${String(wanted)} is not supported (default or none)`,
  );
}

async function runStep(
  host: BuildHost,
  layers: string[],
  config: Environment['config'],
  argv: string[],
  run: RunSettings,
  where: string,
): Promise<string> {
  const network = run.network;
  const left = run.deadlineAt === undefined ? undefined : run.deadlineAt - Date.now();
  const limit = `the build's time limit of ${Math.round((run.timeoutMs ?? 0) / 1000)} s`;
  if (left !== undefined && left <= 0)
    throw new SandgymError('failed_precondition', `${where}: RUN not started: the build ran past ${limit}`);
  const sandbox = await host.createSandboxFromLayers(layers, config, { network });
  try {
    const result = await sandbox.exec(argv, {
      cwd: config.workdir,
      env: config.env,
      user: config.user,
      ...(left === undefined ? {} : { timeoutMs: left }),
    });
    if (result.timedOut) throw new SandgymError('failed_precondition', `${where}: RUN ran past ${limit}`);
    if (result.exitCode !== 0) {
      const tail = (result.stderr || result.stdout).trim().split('\n').slice(-5).join(' | ');
      // the hosts its rules kept it from are most often why a RUN step that fetches fails
      const record =
        network.length === 0 ? undefined : (await sandbox.stats().catch(() => undefined))?.network;
      const refused = record ? recordText(record) : '';
      throw new SandgymError(
        'failed_precondition',
        `${where}: RUN failed with ${result.exitCode === null ? result.signal : `exit code ${result.exitCode}`}: ${tail}${network.length === 0 ? ' (the step had no network: give the build rules, e.g. --build-net mirror:debian)' : ''}${refused ? ` (its network: ${refused}; the build's rules are ${network.join(', ')})` : ''}`,
      );
    }
    // a step that got by without a host (a fallback, an optional fetch) still says which
    const refused =
      network.length === 0 ? undefined : (await sandbox.stats().catch(() => undefined))?.network;
    const said = refused ? recordText(refused) : '';
    if (said) run.notes?.push(`${where}: RUN's network: ${said}`);
    return (
      await sandbox.withWritableLayer((dir) =>
        host.store.addLayerFromDirectory(dir, `${where}: RUN ${argv.join(' ')}`),
      )
    ).digest;
  } finally {
    await sandbox.close();
  }
}

/**
 * WORKDIR's folder as a layer. A folder the stack has already keeps its owner, mode and times
 * (an upper layer's folder hides the lower one's, so a plain mkdir would hand a user's home to
 * root); only missing ones are made new.
 */
async function folderStep(host: BuildHost, layers: string[], folder: string, where: string): Promise<string> {
  const parts = folder.split('/').filter(Boolean);
  const paths = parts.map((_, i) => `/${parts.slice(0, i + 1).join('/')}`);
  const existing = layers.length
    ? await host.withLayerStack(layers, (stack) =>
        withRootedTree(stack, where, async (tree) => {
          const found: Stats[] = [];
          for (const path of paths) {
            // a symlink or a file on the way: what is below it is not the stack's folder
            const stats = await tree.lstat(path);
            if (!stats?.isDirectory()) break;
            found.push(stats);
          }
          return found;
        }),
      )
    : [];
  const root = await host.store.scratch('workdir');
  try {
    await mkdir(join(root, folder), { recursive: true });
    for (const [i, path] of paths.entries()) {
      const st = existing[i];
      if (!st) continue;
      await lchown(join(root, path), st.uid, st.gid);
      await chmod(join(root, path), st.mode & 0o7777);
      await utimes(join(root, path), st.atime, st.mtime);
    }
    return (await host.store.addLayerFromDirectory(root, `${where}: WORKDIR ${folder}`)).digest;
  } finally {
    await host.store.removeScratch(root);
  }
}

/** Where COPY/ADD take files from: the build context, another stage, or an image in the store. */
type CopySource =
  | { kind: 'context'; paths: string[] }
  | { kind: 'layers'; layers: string[]; paths: string[] }
  | { kind: 'heredocs'; documents: Heredoc[] };

async function copyPlan(
  host: BuildHost,
  copy: Extract<DockerInstruction, { kind: 'COPY' | 'ADD' }>,
  stage: Stage,
  sources: CopySources,
  context: BuildContext,
  at: { file: string; line: number },
  expand: (value: string) => string,
  deadlineAt: number | undefined,
): Promise<StepPlan> {
  const where = `${at.file} line ${at.line}`;
  const flags = copy.flags;
  const destination = posix.resolve(stage.config.workdir, expand(copy.destination));
  const intoFolder =
    copy.destination.endsWith('/') ||
    /(^|\/)\.$/.test(copy.destination) ||
    copy.sources.length > 1 ||
    copy.heredocs.length > 1;
  // Dockerfile 1.7's --exclude and --parents change what is copied: ignored, they would copy
  // what the author meant to leave out, or flatten what they meant to keep nested
  for (const flag of ['exclude', 'parents'])
    if (flags[flag] !== undefined)
      throw new SandgymError(
        'invalid_argument',
        `${where}: ${copy.kind} --${flag} is not supported here; copy without it (a RUN step can prune or move what was copied)`,
      );
  const chown = typeof flags['chown'] === 'string' ? expand(flags['chown']) : undefined;
  const chmodFlag = typeof flags['chmod'] === 'string' ? expand(flags['chmod']) : undefined;
  const mode = chmodFlag === undefined ? undefined : Number.parseInt(chmodFlag, 8);
  if (chmodFlag !== undefined && (!/^[0-7]{3,4}$/.test(chmodFlag) || mode === undefined))
    throw new SandgymError(
      'invalid_argument',
      `${where}: --chmod=${chmodFlag} must be an octal mode such as 0755`,
    );
  const ownerLayers = [...stage.layers];
  let source: CopySource;
  if (copy.heredocs.length) {
    source = {
      kind: 'heredocs',
      documents: copy.heredocs.map((doc) => (doc.expands ? { ...doc, body: expand(doc.body) } : doc)),
    };
  } else if (typeof flags['from'] === 'string') {
    const name = expand(flags['from']).toLowerCase();
    const other =
      sources.stage(name) ??
      (await sources.image(name, `${where}: --from`).catch((error: unknown) => {
        throw new SandgymError(
          'invalid_argument',
          `${where}: --from=${name} names no earlier stage, and no image could be had: ${(error as Error).message}`,
          { cause: error },
        );
      }));
    source = { kind: 'layers', layers: other.layers, paths: copy.sources.map(expand) };
  } else {
    if (copy.kind === 'ADD' && copy.sources.some((s) => /^[a-z]+:\/\//i.test(s)))
      throw new SandgymError(
        'invalid_argument',
        `${where}: ADD from a URL is not supported; fetch it in a RUN step with the build's network`,
      );
    const paths = (
      await Promise.all(copy.sources.map((s) => context.sources(at.file, at.line, expand(s))))
    ).flat();
    source = { kind: 'context', paths };
  }
  const key = {
    destination,
    intoFolder,
    chown: chown ?? null,
    mode: mode ?? null,
    source:
      source.kind === 'context'
        ? await context.digest(source.paths)
        : source.kind === 'layers'
          ? { layers: source.layers, paths: source.paths }
          : source.documents,
  };
  return {
    key,
    build: async () => {
      const root = await host.store.scratch('copy');
      try {
        const owner =
          chown === undefined ? { uid: 0, gid: 0 } : await resolveOwner(host, ownerLayers, chown, where);
        const { target, intoFolder: into } = await resolveDestination(
          host,
          ownerLayers,
          destination,
          intoFolder,
          where,
        );
        await withRootedTree(root, `${where}: ${copy.kind}`, async (to) => {
          const options = {
            kind: copy.kind,
            intoFolder: into,
            where,
            budget: await storeBudget(host.store, deadlineAt),
          };
          const written =
            source.kind === 'heredocs'
              ? await writeHeredocs(to, source.documents, target, into)
              : source.kind === 'layers'
                ? await host.withLayerStack(source.layers, (stageRoot) =>
                    withRootedTree(stageRoot, `${where}: --from`, async (from) =>
                      copyIntoTree(from, await stageSources(from, source.paths, where), to, target, options),
                    ),
                  )
                : await withRootedTree(context.root, `${where}: build context`, (from) =>
                    copyIntoTree(
                      from,
                      source.paths.map((path) => ({
                        path: relative(context.root, path),
                        name: basename(path),
                      })),
                      to,
                      target,
                      { ...options, keep: (path) => context.keeps(join(context.root, path)) },
                    ),
                  );
          for (const path of written)
            await to.setAttributes(path, { ...owner, ...(mode === undefined ? {} : { mode }) });
        });
        return (await host.store.addLayerFromDirectory(root, `${where}: ${copy.text}`)).digest;
      } finally {
        await host.store.removeScratch(root);
      }
    },
  };
}

/**
 * Where COPY/ADD write in the stage: the destination with the image's own symlinks on it followed
 * inside the stage, as Docker does (`COPY x /bin/` on a merged-/usr base writes /usr/bin/x, and
 * keeps /bin the link it is). A file destination that is a folder of the stage (`COPY app.py
 * /app` after `WORKDIR /app`) is copied into, as Docker does, never replaced by the file; what
 * does not exist yet is made as written. The result has no symlink of the stage on it and never
 * leaves its root.
 */
async function resolveDestination(
  host: BuildHost,
  layers: string[],
  destination: string,
  intoFolder: boolean,
  where: string,
): Promise<{ target: string; intoFolder: boolean }> {
  const names = destination.split('/').filter(Boolean);
  if (layers.length === 0 || names.length === 0) return { target: destination, intoFolder };
  return host.withLayerStack(layers, (root) =>
    withRootedTree(root, where, async (stage) => {
      if (!intoFolder) {
        const real = await stage.realPath(names.join('/'));
        if (real !== undefined && (await stage.lstat(real))?.isDirectory())
          return { target: `/${real}`, intoFolder: true };
      }
      const last = intoFolder ? [] : names.splice(-1);
      for (let known = names.length; known > 0; known--) {
        const real = await stage.realPath(names.slice(0, known).join('/'));
        if (real !== undefined)
          return {
            target: `/${[real, ...names.slice(known), ...last].filter(Boolean).join('/')}`,
            intoFolder,
          };
      }
      return { target: destination, intoFolder };
    }),
  );
}

/** Writes COPY's here-documents: each a file named as its marker in the destination folder, or the destination itself. */
async function writeHeredocs(
  to: RootedTree,
  documents: Heredoc[],
  target: string,
  intoFolder: boolean,
): Promise<string[]> {
  const written: string[] = [];
  for (const doc of documents) {
    const path = intoFolder ? posix.join(target, doc.name) : target;
    await to.remove(path);
    await to.writeFile(path, [Buffer.from(doc.body)], { mode: 0o644 });
    written.push(path);
  }
  return written;
}

/**
 * `COPY --from` sources: each path resolved inside the stage as Docker does (a symlink in the
 * stage, absolute or not, stays in the stage), named in a folder as written.
 */
async function stageSources(
  from: RootedTree,
  paths: readonly string[],
  where: string,
): Promise<TreeSource[]> {
  const sources: TreeSource[] = [];
  for (const path of paths) {
    const real = await from.realPath(path);
    if (real === undefined)
      throw new SandgymError('invalid_argument', `${where}: COPY --from source ${path} does not exist`);
    sources.push({ path: real, name: posix.basename(posix.resolve('/', path)) });
  }
  return sources;
}

/** `--chown=user[:group]` as numbers, names looked up in the stage's own /etc/passwd and /etc/group. */
async function resolveOwner(
  host: BuildHost,
  layers: string[],
  spec: string,
  where: string,
): Promise<{ uid: number; gid: number }> {
  const [user = '', group] = spec.split(':');
  const numeric = (value: string | undefined): number | undefined =>
    value !== undefined && /^\d+$/.test(value) ? Number(value) : undefined;
  if (numeric(user) !== undefined && (group === undefined || numeric(group) !== undefined))
    return { uid: numeric(user) ?? 0, gid: numeric(group) ?? numeric(user) ?? 0 };
  return host.withLayerStack(layers, (root) =>
    withRootedTree(root, where, async (stage) => {
      // read inside the stage: its /etc/passwd may be a symlink to anywhere
      const read = (name: string) =>
        stage.readFile(`etc/${name}`, MAX_ACCOUNTS_BYTES).then(
          (bytes) => bytes.toString('utf8'),
          () => '',
        );
      const passwd = (await read('passwd')).split('\n').map((l) => l.split(':'));
      const groups = (await read('group')).split('\n').map((l) => l.split(':'));
      const entry = numeric(user) === undefined ? passwd.find((p) => p[0] === user) : undefined;
      const uid = numeric(user) ?? (entry ? Number(entry[2]) : undefined);
      if (uid === undefined)
        throw new SandgymError(
          'invalid_argument',
          `${where}: --chown: no user "${user}" in the image's /etc/passwd`,
        );
      let gid = group === undefined ? (entry ? Number(entry[3]) : uid) : numeric(group);
      if (gid === undefined) {
        const found = groups.find((g) => g[0] === group);
        if (!found)
          throw new SandgymError(
            'invalid_argument',
            `${where}: --chown: no group "${group}" in the image's /etc/group`,
          );
        gid = Number(found[2]);
      }
      return { uid, gid };
    }),
  );
}
