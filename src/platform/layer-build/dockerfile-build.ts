import { createHash } from 'node:crypto';
import { cp, lstat, mkdir, readFile, readdir, readlink, realpath, rm } from 'node:fs/promises';
import { dirname, join, posix, resolve, sep } from 'node:path';
import { SandgymError } from '../../common/index.ts';
import type { Environment, ProjectStore } from '../layer-store.ts';
import type { Sandbox } from '../platform-client.ts';
import { parseDockerfile, type DockerInstruction } from './dockerfile-parse.ts';
import { extractTar, openTar } from './tar-extract.ts';

/** What the builder needs from the platform: a sandbox on an explicit layer stack. */
export interface BuildHost {
  readonly store: ProjectStore;
  createSandboxFromLayers(layers: string[], config: Environment['config']): Promise<Sandbox>;
}

/** Options for {@link buildFromDockerfile}. */
export interface DockerfileBuildOptions {
  file: string;
  /** Folder COPY and ADD read from; default: the Dockerfile's folder. */
  context?: string;
  /** The environment to record, "name:version". */
  name: string;
  /** Called as each step finishes, for progress. */
  onStep?: (step: BuildStep) => void;
  /**
   * The environment to start from when FROM names an image that is not in the store (a task's
   * `FROM ubuntu:22.04`, say). Without it such a FROM is an error.
   */
  fromFallback?: string;
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

function hash(...parts: unknown[]): string {
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex');
}

/** A digest of the files COPY/ADD would take, so an edit to any of them misses the cache. */
async function contentDigest(paths: string[]): Promise<string> {
  const digest = createHash('sha256');
  const walk = async (path: string, rel: string): Promise<void> => {
    const info = await lstat(path);
    digest.update(`${rel}\0${info.mode}\0`);
    if (info.isSymbolicLink()) digest.update(await readlink(path));
    else if (info.isFile()) digest.update(await readFile(path));
    else if (info.isDirectory())
      for (const child of (await readdir(path)).sort()) await walk(join(path, child), `${rel}/${child}`);
  };
  for (const path of paths) await walk(path, path);
  return digest.digest('hex');
}

function isTarName(path: string): boolean {
  return /\.(tar|tar\.gz|tgz)$/.test(path);
}

function describe(instruction: DockerInstruction): string {
  switch (instruction.kind) {
    case 'FROM':
      return `FROM ${instruction.environment}`;
    case 'RUN':
      return `RUN ${instruction.argv.join(' ')}`;
    case 'COPY':
    case 'ADD':
      return `${instruction.kind} ${instruction.sources.join(' ')} ${instruction.destination}`;
    case 'ENV':
      return `ENV ${Object.entries(instruction.values)
        .map(([k, v]) => `${k}=${v}`)
        .join(' ')}`;
    case 'WORKDIR':
      return `WORKDIR ${instruction.path}`;
    case 'USER':
      return `USER ${instruction.user}`;
  }
}

/**
 * Builds an environment from a Dockerfile without a Docker engine: RUN steps run in our own
 * container backend and each step's writable layer becomes a layer; COPY and ADD become layers
 * of their own. Each step is cached by a key chained from its parent's key, the instruction, the
 * config it runs under and (for COPY/ADD) the content it takes, as `docker build` does.
 */
export async function buildFromDockerfile(
  host: BuildHost,
  options: DockerfileBuildOptions,
): Promise<DockerfileBuildResult> {
  const file = resolve(options.file);
  const context = resolve(options.context ?? dirname(file));
  const text = await readFile(file, 'utf8').catch((error: unknown) => {
    throw new SandgymError('not_found', `Cannot read Dockerfile ${file}`, { cause: error });
  });
  const [from, ...rest] = parseDockerfile(text, file);
  if (from?.kind !== 'FROM')
    throw new SandgymError('invalid_argument', `${file}: the first instruction must be FROM`);
  const notes: string[] = [];
  const known =
    /^[a-z0-9][a-z0-9._-]*(:[A-Za-z0-9][A-Za-z0-9._-]*)?$/.test(from.environment) &&
    host.store.hasEnvironment(from.environment);
  const baseRef = known || !options.fromFallback ? from.environment : options.fromFallback;
  if (baseRef !== from.environment)
    notes.push(`FROM ${from.environment} is not in the store; built on ${baseRef} instead`);
  const base = await host.store.getEnvironment(baseRef).catch((error: unknown) => {
    throw new SandgymError('not_found', `${file} line ${from.line}: ${(error as Error).message}`, {
      cause: error,
    });
  });
  const layers = [...base.layers];
  const config = { env: { ...base.config.env }, workdir: base.config.workdir, user: base.config.user };
  let key = hash('FROM', layers, config);
  const steps: BuildStep[] = [];
  const record = (step: BuildStep): void => {
    steps.push(step);
    options.onStep?.(step);
  };
  for (const instruction of rest) {
    const line = instruction.line;
    const label = describe(instruction);
    switch (instruction.kind) {
      case 'ENV':
      case 'USER': {
        if (instruction.kind === 'ENV') Object.assign(config.env, instruction.values);
        if (instruction.kind === 'USER') config.user = instruction.user;
        key = hash(key, label);
        record({ line, instruction: label, outcome: 'config' });
        continue;
      }
      case 'FROM':
        throw new SandgymError('invalid_argument', `${file} line ${line}: only one FROM is supported`);
      case 'WORKDIR':
      case 'RUN':
      case 'COPY':
      case 'ADD': {
        // WORKDIR makes its folder, as Docker does, so commands can start in it
        if (instruction.kind === 'WORKDIR') config.workdir = posix.resolve(config.workdir, instruction.path);
        const copies = instruction.kind === 'COPY' || instruction.kind === 'ADD' ? instruction : undefined;
        const sources = copies
          ? await Promise.all(copies.sources.map((s) => inContext(file, line, context, s)))
          : [];
        key = hash(key, label, config, copies ? await contentDigest(sources) : '');
        const cached = await host.store.cachedStep(key);
        const where = `${file} line ${line}`;
        const layer =
          cached ??
          (instruction.kind === 'RUN'
            ? await runStep(host, layers, config, instruction.argv, where)
            : copies
              ? await copyStep(host.store, copies, sources, config.workdir, where)
              : await folderStep(host.store, config.workdir, where));
        if (!cached) await host.store.cacheStep(key, layer);
        layers.push(layer);
        record({ line, instruction: label, outcome: cached ? 'cached' : 'built', layer });
        break;
      }
      default: {
        const unknown: never = instruction;
        throw new SandgymError(
          'invalid_argument',
          `${file}: unexpected instruction ${JSON.stringify(unknown)}`,
        );
      }
    }
  }
  const [name = '', version = 'latest'] = options.name.split(':');
  const environment = await host.store.putEnvironment({
    name,
    version,
    layers,
    config,
    description: `built from ${file}`,
  });
  return { environment, steps, notes };
}

/**
 * A COPY/ADD source as a real path inside the build context. Symlinks are resolved first, the
 * context's own included, so neither `../` nor a link (to /etc/shadow, or a folder leading out)
 * takes anything from outside it; what a link inside points at inside is what gets copied.
 */
async function inContext(file: string, line: number, context: string, source: string): Promise<string> {
  const outside = (): never => {
    throw new SandgymError(
      'invalid_argument',
      `${file} line ${line}: "${source}" is outside the build context ${context}: COPY and ADD take only files inside it (a symlink may not lead out)`,
    );
  };
  const root = await realpath(context);
  const lexical = resolve(root, source);
  if (lexical !== root && !lexical.startsWith(root + sep)) outside();
  const real = await realpath(lexical).catch((error: unknown) => {
    throw new SandgymError(
      'invalid_argument',
      `${file} line ${line}: COPY/ADD source ${source} does not exist`,
      {
        cause: error,
      },
    );
  });
  if (real !== root && !real.startsWith(root + sep)) outside();
  return real;
}

async function runStep(
  host: BuildHost,
  layers: string[],
  config: Environment['config'],
  argv: string[],
  where: string,
): Promise<string> {
  const sandbox = await host.createSandboxFromLayers(layers, config);
  try {
    const result = await sandbox.exec(argv, { cwd: config.workdir, env: config.env, user: config.user });
    if (result.exitCode !== 0) {
      const tail = (result.stderr || result.stdout).trim().split('\n').slice(-5).join(' | ');
      throw new SandgymError(
        'failed_precondition',
        `${where}: RUN failed with ${result.exitCode === null ? result.signal : `exit code ${result.exitCode}`}: ${tail}`,
      );
    }
    return (
      await sandbox.withWritableLayer((dir) =>
        host.store.addLayerFromDirectory(dir, `${where}: RUN ${argv.join(' ')}`),
      )
    ).digest;
  } finally {
    await sandbox.close();
  }
}

async function folderStep(store: ProjectStore, folder: string, where: string): Promise<string> {
  const root = await store.scratch('workdir');
  try {
    await mkdir(join(root, folder), { recursive: true });
    return (await store.addLayerFromDirectory(root, `${where}: WORKDIR ${folder}`)).digest;
  } finally {
    await rm(root, { recursive: true, force: true });
  }
}

async function copyStep(
  store: ProjectStore,
  instruction: Extract<DockerInstruction, { kind: 'COPY' | 'ADD' }>,
  sources: string[],
  workdir: string,
  where: string,
): Promise<string> {
  const root = await store.scratch('copy');
  try {
    const destination = posix.resolve(workdir, instruction.destination);
    // As in Docker: a trailing slash, ".", or several sources mean "into this folder".
    const intoFolder =
      instruction.destination.endsWith('/') ||
      /(^|\/)\.$/.test(instruction.destination) ||
      sources.length > 1;
    for (const source of sources) {
      const info = await lstat(source).catch(() => {
        throw new SandgymError('not_found', `${where}: ${instruction.kind} source ${source} does not exist`);
      });
      if (instruction.kind === 'ADD' && info.isFile() && isTarName(source)) {
        const target = join(root, destination);
        await mkdir(target, { recursive: true });
        await extractTar(await openTar(source), source, target, 'apply');
      } else if (info.isDirectory()) {
        await cp(source, join(root, destination), {
          recursive: true,
          verbatimSymlinks: true,
          preserveTimestamps: true,
        });
      } else {
        const target = intoFolder
          ? join(root, destination, source.split(sep).pop() ?? '')
          : join(root, destination);
        await mkdir(dirname(target), { recursive: true });
        await cp(source, target, { verbatimSymlinks: true, preserveTimestamps: true });
      }
    }
    return (
      await store.addLayerFromDirectory(
        root,
        `${where}: ${instruction.kind} ${instruction.sources.join(' ')}`,
      )
    ).digest;
  } finally {
    await rm(root, { recursive: true, force: true });
  }
}
