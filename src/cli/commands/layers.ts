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
  imageSources,
  parseCommandArgs,
  text,
  texts,
  type ParsedCommandArgs,
} from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';
import { envRemove } from './env-rm.ts';

/** The whole store: what `layer ls` shows the node's admin. */
async function openWholeStore(): Promise<LayerStore> {
  return LayerStore.open(await prepareDataFolder(defaultStoreDir(defaultDataDir()), '$SANDGYM_STORE'));
}

/** The store as this command's project ($SANDGYM_PROJECT) sees it: what builds and `env` use. */
async function openStore(): Promise<ProjectStore> {
  return (await openWholeStore()).forProject(defaultProject());
}

function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

/** `sandgym layer ls|build`. */
export async function layerCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === 'ls') return layerList(rest);
  if (sub === 'build') return layerBuild(rest);
  if (sub === 'gc') return layerGc(rest);
  if (sub === 'pull') return layerPull(rest);
  throw new UsageError(
    'sandgym layer: use "layer ls", "layer pull IMAGE", "layer gc [--min-age-minutes N] [--all-projects]" or "layer build (--from-dir D | --from-tar T | --from-oci A | --dockerfile F [--build-arg K=V] [--target STAGE] [--build-net RULE|none] [--fallback-base ENV] [--registry-auth FILE] [--insecure-registry HOST] | --from-sandbox ID) [--name NAME:VERSION] [--base ENV]"',
  );
}

/** `sandgym layer pull IMAGE`: an image from its registry into the store, one environment per digest. */
async function layerPull(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('layer pull', args, { json: { type: 'boolean' }, ...IMAGE_SOURCE_OPTIONS });
  const [image, ...extra] = parsed.positionals;
  if (!image || extra.length)
    throw new UsageError(
      'sandgym layer pull: give one image, e.g. sandgym layer pull 127.0.0.1:5000/team/tool:1',
    );
  const { registry } = imageSources(parsed);
  const pulled = await pullImage(await openStore(), parseImageReference(image), registry);
  const ref = `${pulled.environment.name}:${pulled.environment.version}`;
  if (parsed.values['json']) console.log(JSON.stringify({ ...pulled, ref }));
  else {
    console.log(ref);
    console.error(
      `sandgym: ${image} is ${pulled.digest}${pulled.cached ? ', already in the store' : ', pulled'}`,
    );
  }
  return EXIT.ok;
}

async function layerGc(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('layer gc', args, {
    'min-age-minutes': { type: 'string' },
    'all-projects': { type: 'boolean' },
    json: { type: 'boolean' },
  });
  const minutes = text(parsed, 'min-age-minutes');
  if (minutes !== undefined && !(Number(minutes) >= 0)) {
    throw new UsageError(`sandgym layer gc: --min-age-minutes must be a number of minutes, got "${minutes}"`);
  }
  await using platform = await Platform.local();
  const report = await platform.layerGc({
    ...(minutes === undefined ? {} : { minAgeMs: Number(minutes) * 60_000 }),
    allProjects: parsed.values['all-projects'] === true,
  });
  if (parsed.values['json']) console.log(JSON.stringify(report));
  else {
    console.error(
      `sandgym layer gc: ${report.unmounted.length} mounts, ${report.removedCopies.length} node copies, ` +
        `${report.removedLayers.length} store layers (${mib(report.freedBytes)}) removed`,
    );
  }
  return EXIT.ok;
}

async function layerList(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('layer ls', args, { json: { type: 'boolean' } });
  const layers = await (await openWholeStore()).listLayers();
  if (parsed.values['json']) console.log(JSON.stringify({ layers }));
  else
    for (const l of layers)
      console.log(`${l.digest}  ${mib(l.sizeBytes).padStart(10)}  ${l.createdAt}  ${l.createdFrom}`);
  return EXIT.ok;
}

async function layerBuild(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('layer build', args, {
    'from-dir': { type: 'string' },
    'from-tar': { type: 'string' },
    'from-oci': { type: 'string' },
    dockerfile: { type: 'string' },
    'from-sandbox': { type: 'string' },
    context: { type: 'string' },
    name: { type: 'string' },
    base: { type: 'string' },
    'build-arg': { type: 'string', multiple: true },
    'build-net': { type: 'string', multiple: true },
    ...IMAGE_SOURCE_OPTIONS,
    target: { type: 'string' },
    json: { type: 'boolean' },
  });
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
  if (sources.dockerfile) return dockerfileBuild(sources.dockerfile, parsed);
  if (sources.sandbox) return sandboxBuild(sources.sandbox, parsed);
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
  return printBuilt(parsed, { layer, environment });
}

/** A build's result: JSON on stdout, or the layer digest on stdout and the environment on stderr. */
function printBuilt(
  parsed: ParsedCommandArgs,
  built: { layer: LayerManifest; environment?: Environment | undefined },
): number {
  if (parsed.values['json']) console.log(JSON.stringify(built));
  else {
    console.log(built.layer.digest);
    const e = built.environment;
    if (e) console.error(`sandgym: environment ${e.name}:${e.version} (${e.layers.length} layers)`);
  }
  return EXIT.ok;
}

/** pack_diff from the command line: a live sandbox's changes as a layer and an environment. */
async function sandboxBuild(id: string, parsed: ParsedCommandArgs): Promise<number> {
  const name = text(parsed, 'name');
  if (!name)
    throw new UsageError(
      'sandgym layer build --from-sandbox: give --name NAME:VERSION for the new environment',
    );
  await using platform = await Platform.local();
  return printBuilt(parsed, await platform.packDiff(id, { name }));
}

async function dockerfileBuild(file: string, parsed: ParsedCommandArgs): Promise<number> {
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
  if (parsed.values['json']) console.log(JSON.stringify(result));
  else console.error(`sandgym: environment ${name} (${result.environment.layers.length} layers)`);
  return EXIT.ok;
}

/** `sandgym env ls|show`. */
export async function envCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === 'rm') return envRemove(await openStore(), rest);
  const parsed = parseCommandArgs(`env ${sub ?? ''}`.trim(), rest, { json: { type: 'boolean' } });
  const store = await openStore();
  if (sub === 'ls') {
    const environments = await store.listEnvironments();
    if (parsed.values['json']) console.log(JSON.stringify({ environments }));
    else
      for (const e of environments)
        console.log(`${`${e.name}:${e.version}`.padEnd(28)} ${e.layers.length} layer(s)  ${e.description}`);
    return EXIT.ok;
  }
  if (sub === 'show') {
    const ref = parsed.positionals[0];
    if (!ref)
      throw new UsageError('sandgym env show: give an environment, e.g. sandgym env show debian:bookworm');
    const environment = await store.getEnvironment(ref);
    const layers = await Promise.all(environment.layers.map((d) => store.getLayer(d)));
    if (parsed.values['json']) console.log(JSON.stringify({ environment, layers }));
    else {
      console.log(`${environment.name}:${environment.version}  ${environment.description}`);
      console.log(`workdir ${environment.config.workdir}, user ${environment.config.user}`);
      for (const [key, value] of Object.entries(environment.config.env)) console.log(`env ${key}=${value}`);
      layers.forEach((l, i) => console.log(`layer ${i} ${l.digest} ${mib(l.sizeBytes)} ${l.createdFrom}`));
    }
    return EXIT.ok;
  }
  throw new UsageError('sandgym env: use "env ls", "env show NAME:VERSION" or "env rm NAME:VERSION"');
}
