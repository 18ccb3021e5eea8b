import { resolve } from 'node:path';
import { prepareDataFolder } from '../../backends/index.ts';
import {
  LayerStore,
  Platform,
  defaultProject,
  type ProjectStore,
  buildLayerFromOci,
  parseImageReference,
  pullImage,
  buildLayerFromTar,
  defaultDataDir,
  defaultStoreDir,
  parseEnvironmentRef,
  type Environment,
  type LayerManifest,
} from '../../platform/index.ts';
import {
  IMAGE_SOURCE_OPTIONS,
  flag,
  imageSources,
  jsonOutput,
  numberOf,
  text,
  texts,
  type JsonOutput,
  type ParsedCommandArgs,
} from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { projectSandboxRecord } from '../held-sandboxes.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/** The whole store: what `layer ls` shows the node's admin. */
async function openWholeStore(): Promise<LayerStore> {
  return LayerStore.open(await prepareDataFolder(defaultStoreDir(defaultDataDir()), '$SANDGYM_STORE'));
}

/** The store as this command's project ($SANDGYM_PROJECT) sees it: what builds and `env` use. */
export async function openStore(): Promise<ProjectStore> {
  return (await openWholeStore()).forProject(defaultProject());
}

function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

export const LAYER_PULL_COMMAND = {
  name: 'layer pull',
  summary: 'an image from its OCI registry into the store, by digest',
  operands: 'IMAGE',
  options: { ...JSON_OPTION, ...IMAGE_SOURCE_OPTIONS },
} as const satisfies CommandSpec;

/** `sandgym layer pull IMAGE`: an image from its registry into the store, one environment per digest. */
export async function layerPullCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(LAYER_PULL_COMMAND, args);
  const [image, ...extra] = parsed.positionals;
  if (!image || extra.length)
    throw new UsageError(
      'sandgym layer pull: give one image, e.g. sandgym layer pull 127.0.0.1:5000/team/tool:1',
    );
  const json = await jsonOutput(parsed);
  const { registry } = imageSources(parsed);
  const pulled = await pullImage(await openStore(), parseImageReference(image), registry);
  const ref = `${pulled.environment.name}:${pulled.environment.version}`;
  if (json) await json.write({ ...pulled, ref });
  else {
    console.log(ref);
    console.error(
      `sandgym: ${image} is ${pulled.digest}${pulled.cached ? ', already in the store' : ', pulled'}`,
    );
  }
  return EXIT.ok;
}

export const LAYER_GC_COMMAND = {
  name: 'layer gc',
  summary: 'remove unused layer mounts, node copies and unreferenced layers',
  options: {
    'min-age-minutes': {
      type: 'number',
      range: [0, 525_600],
      default: 60,
      description: 'spare what was used more recently than this',
    },
    'all-projects': { type: 'boolean', description: "every project's layers, not just $SANDGYM_PROJECT's" },
    ...JSON_OPTION,
  },
} as const satisfies CommandSpec;

/** `sandgym layer gc`: what no sandbox and no environment uses any more. */
export async function layerGcCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(LAYER_GC_COMMAND, args);
  const json = await jsonOutput(parsed);
  await using platform = await Platform.local();
  const report = await platform.layerGc({
    minAgeMs: (numberOf(parsed, 'min-age-minutes') ?? 0) * 60_000,
    allProjects: flag(parsed, 'all-projects'),
  });
  if (json) await json.write(report);
  else {
    console.error(
      `sandgym layer gc: ${report.unmounted.length} mounts, ${report.removedCopies.length} node copies, ` +
        `${report.removedLayers.length} store layers (${mib(report.freedBytes)}) removed`,
    );
  }
  return EXIT.ok;
}

export const LAYER_LS_COMMAND = {
  name: 'layer ls',
  summary: 'the layers in the store',
  options: { ...JSON_OPTION },
} as const satisfies CommandSpec;

export async function layerListCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(LAYER_LS_COMMAND, args);
  const json = await jsonOutput(parsed);
  const layers = await (await openWholeStore()).listLayers();
  if (json) await json.write({ layers });
  else
    for (const l of layers)
      console.log(`${l.digest}  ${mib(l.sizeBytes).padStart(10)}  ${l.createdAt}  ${l.createdFrom}`);
  return EXIT.ok;
}

export const LAYER_BUILD_COMMAND = {
  name: 'layer build',
  summary: 'a layer (and optionally an environment) from a folder, tar, OCI image, Dockerfile or sandbox',
  details:
    "Give exactly one source. --from-sandbox is pack_diff: a live sandbox's changes over its own stack.\n" +
    'A Dockerfile is built by the Dockerfile reference, RUN in our own containers reaching the\n' +
    "node's package mirrors, FROM from the store or pulled, each step cached.",
  options: {
    'from-dir': { type: 'string', value: 'DIR', description: 'source: a folder' },
    'from-tar': { type: 'string', value: 'FILE', description: 'source: a tar or tar.gz' },
    'from-oci': {
      type: 'string',
      value: 'ARCHIVE',
      description: 'source: an OCI image (docker save or an OCI layout)',
    },
    dockerfile: { type: 'string', value: 'FILE', description: 'source: a Dockerfile (needs --name)' },
    'from-sandbox': { type: 'string', value: 'ID', description: 'source: a live sandbox (needs --name)' },
    name: { type: 'string', value: 'NAME:VERSION', description: 'the environment to make' },
    base: { type: 'string', value: 'ENV', description: 'the environment the new layer goes on top of' },
    context: {
      type: 'string',
      value: 'DIR',
      description: "the Dockerfile's build context (default its folder)",
    },
    'build-arg': { type: 'string', value: 'K=V', multiple: true, description: 'a Dockerfile ARG' },
    target: { type: 'string', value: 'STAGE', description: 'the Dockerfile stage to build' },
    'build-net': {
      type: 'string',
      value: 'RULE',
      multiple: true,
      description: "a network rule RUN may use (none: offline; default the node's mirrors)",
    },
    ...IMAGE_SOURCE_OPTIONS,
    ...JSON_OPTION,
  },
} as const satisfies CommandSpec;

export async function layerBuildCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(LAYER_BUILD_COMMAND, args);
  const sources = {
    dir: text(parsed, 'from-dir'),
    tar: text(parsed, 'from-tar'),
    oci: text(parsed, 'from-oci'),
    dockerfile: text(parsed, 'dockerfile'),
    sandbox: text(parsed, 'from-sandbox'),
  };
  const given = Object.entries(sources).filter(([, v]) => v !== undefined);
  if (given.length !== 1) {
    throw new UsageError(
      'sandgym layer build: give exactly one source: --from-dir D, --from-tar T, --from-oci A, --dockerfile F or --from-sandbox ID',
    );
  }
  const json = await jsonOutput(parsed);
  if (sources.dockerfile) return dockerfileBuild(sources.dockerfile, parsed, json);
  if (sources.sandbox) return sandboxBuild(sources.sandbox, parsed, json);
  const [kind, source = ''] = given[0] as [keyof typeof sources, string];
  const name = text(parsed, 'name');
  const base = text(parsed, 'base');
  if (base && !name) throw new UsageError('sandgym layer build: --base needs --name for the new environment');
  const ref = name ? parseEnvironmentRef(name) : undefined;
  const store = await openStore();
  const baseEnvironment = base ? await store.getEnvironment(base) : undefined;
  const built =
    kind === 'oci'
      ? await buildLayerFromOci(store, source)
      : {
          layer:
            kind === 'dir'
              ? await store.addLayerFromDirectory(resolve(source), `directory ${resolve(source)}`)
              : await buildLayerFromTar(store, source),
          config: undefined,
        };
  const layer = built.layer;
  const environment = ref
    ? await store.putEnvironment({
        ...ref,
        layers: [...(baseEnvironment?.layers ?? []), layer.digest],
        config: built.config ?? baseEnvironment?.config ?? {},
        description: base ? `${base} + ${source}` : `built from ${source}`,
      })
    : undefined;
  return printBuilt(json, { layer, environment });
}

/** A build's result: JSON on stdout, or the layer digest on stdout and the environment on stderr. */
async function printBuilt(
  json: JsonOutput | undefined,
  built: { layer: LayerManifest; environment?: Environment | undefined },
): Promise<number> {
  if (json) await json.write(built);
  else {
    console.log(built.layer.digest);
    const e = built.environment;
    if (e) console.error(`sandgym: environment ${e.name}:${e.version} (${e.layers.length} layers)`);
  }
  return EXIT.ok;
}

/** pack_diff from the command line: a live sandbox's changes as a layer and an environment. */
async function sandboxBuild(
  id: string,
  parsed: ParsedCommandArgs,
  json: JsonOutput | undefined,
): Promise<number> {
  const name = text(parsed, 'name');
  if (!name)
    throw new UsageError(
      'sandgym layer build --from-sandbox: give --name NAME:VERSION for the new environment',
    );
  await using platform = await Platform.local();
  // this project's sandbox only: another's is as missing as one never made
  await projectSandboxRecord(platform, id);
  return await printBuilt(json, await platform.packDiff(id, { name }));
}

async function dockerfileBuild(
  file: string,
  parsed: ParsedCommandArgs,
  json: JsonOutput | undefined,
): Promise<number> {
  const name = text(parsed, 'name');
  if (!name)
    throw new UsageError(
      'sandgym layer build --dockerfile: give --name NAME:VERSION for the environment it builds',
    );
  parseEnvironmentRef(name);
  const context = text(parsed, 'context');
  const target = text(parsed, 'target');
  const buildArgs: Record<string, string> = {};
  for (const pair of texts(parsed, 'build-arg')) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new UsageError(`sandgym layer build: --build-arg takes NAME=value, got "${pair}"`);
    buildArgs[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  const network = texts(parsed, 'build-net');
  await using platform = await Platform.local({ images: imageSources(parsed) });
  const result = await platform.buildFromDockerfile({
    file,
    name,
    buildArgs,
    ...(context ? { context } : {}),
    ...(target ? { target } : {}),
    // `--build-net none` builds offline; without the flag, RUN reaches the node's package mirrors
    ...(network.length ? { network: network.filter((rule) => rule !== 'none') } : {}),
    onStep: (step) =>
      console.error(`sandgym: line ${step.line} ${step.outcome.padEnd(6)} ${step.instruction}`),
  });
  for (const note of result.notes) console.error(`sandgym: ${note}`);
  if (json) await json.write(result);
  else console.error(`sandgym: environment ${name} (${result.environment.layers.length} layers)`);
  return EXIT.ok;
}

export const ENV_LS_COMMAND = {
  name: 'env ls',
  summary: 'environments: layer stacks plus config, as this project ($SANDGYM_PROJECT) sees them',
  options: { ...JSON_OPTION },
} as const satisfies CommandSpec;

export async function envListCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(ENV_LS_COMMAND, args);
  const json = await jsonOutput(parsed);
  const environments = await (await openStore()).listEnvironments();
  if (json) await json.write({ environments });
  else
    for (const e of environments)
      console.log(`${`${e.name}:${e.version}`.padEnd(28)} ${e.layers.length} layer(s)  ${e.description}`);
  return EXIT.ok;
}

export const ENV_SHOW_COMMAND = {
  name: 'env show',
  summary: 'one environment: its config and each of its layers',
  operands: 'NAME:VERSION',
  options: { ...JSON_OPTION },
} as const satisfies CommandSpec;

export async function envShowCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(ENV_SHOW_COMMAND, args);
  const [ref, ...extra] = parsed.positionals;
  if (!ref || extra.length)
    throw new UsageError('sandgym env show: give one environment, e.g. sandgym env show debian:bookworm');
  const json = await jsonOutput(parsed);
  const store = await openStore();
  const environment = await store.getEnvironment(ref);
  const layers = await Promise.all(environment.layers.map((d) => store.getLayer(d)));
  if (json) await json.write({ environment, layers });
  else {
    console.log(`${environment.name}:${environment.version}  ${environment.description}`);
    console.log(`workdir ${environment.config.workdir}, user ${environment.config.user}`);
    for (const [key, value] of Object.entries(environment.config.env)) console.log(`env ${key}=${value}`);
    layers.forEach((l, i) => console.log(`layer ${i} ${l.digest} ${mib(l.sizeBytes)} ${l.createdFrom}`));
  }
  return EXIT.ok;
}
