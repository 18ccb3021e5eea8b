import { readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

/** Layers from the bottom up; a layer may import only from itself and the layers below it. */
export const LAYERS = ['common', 'backends', 'platform', 'env', 'rollout', 'cli'] as const;

/** Modules only some folders may import (docs/architecture.md, "The code, layer by layer"). */
const RESTRICTED: { module: RegExp; allowed: RegExp; why: string }[] = [
  { module: /^@grpc\/grpc-js/, allowed: /^src\/platform\/wire\//, why: 'gRPC lives in src/platform/wire' },
  {
    module: /^rxjs/,
    allowed: /^src\/(rollout|platform)\//,
    why: 'rxjs lives in src/rollout and src/platform',
  },
  { module: /^etcd3$/, allowed: /^src\/platform\/etcd\//, why: 'etcd lives in src/platform/etcd' },
  {
    module: /^prom-client$/,
    allowed: /^src\/platform\/metrics\//,
    why: 'Prometheus metrics live in src/platform/metrics',
  },
  {
    module: /^node:child_process$/,
    allowed: /^src\/backends\//,
    why: 'processes are started in src/backends',
  },
];

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return path.endsWith('.ts') ? [path] : [];
  });
}

function importsOf(text: string): string[] {
  const found: string[] = [];
  for (const match of text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^'"]*?from\s*['"]([^'"]+)['"]/g))
    found.push(match[1] ?? '');
  for (const match of text.matchAll(/import\(\s*['"]([^'"]+)['"]\s*\)/g)) found.push(match[1] ?? '');
  return found;
}

/** The package's entry points (src/index.ts, src/client.ts): above every layer. */
const DOOR = 'door';

function layerOf(file: string): string | undefined {
  const parts = file.split('/');
  if (parts[0] !== 'src') return undefined;
  return parts.length === 2 ? DOOR : parts[1];
}

/**
 * Checks the source tree under `root`: imports go down the layers only, cross into another layer
 * only through its index.ts, never reach into another layer's internals, respect the
 * dependency homes, and form no cycle. Returns one line per violation.
 */
export function checkImports(root: string): string[] {
  const problems: string[] = [];
  const graph = new Map<string, string[]>();
  const files = sourceFiles(join(root, 'src')).map((f) => relative(root, f));
  for (const file of files) {
    const edges: string[] = [];
    const layer = layerOf(file);
    for (const spec of importsOf(readFileSync(join(root, file), 'utf8'))) {
      if (!spec.startsWith('.')) {
        const rule = RESTRICTED.find((r) => r.module.test(spec));
        if (rule && !rule.allowed.test(file)) problems.push(`${file}: imports ${spec}, but ${rule.why}`);
        continue;
      }
      const target = relative(root, resolve(root, dirname(file), spec));
      edges.push(target);
      const targetLayer = layerOf(target);
      if (!layer || !targetLayer || targetLayer === layer) continue;
      const from = layer === DOOR ? LAYERS.length : LAYERS.indexOf(layer as (typeof LAYERS)[number]);
      const to = LAYERS.indexOf(targetLayer as (typeof LAYERS)[number]);
      if (to > from)
        problems.push(
          `${file}: imports ${target}, but ${layer} may not import from ${targetLayer} (imports go down only)`,
        );
      else if (target !== `src/${targetLayer}/index.ts`) {
        problems.push(`${file}: imports ${target}; import src/${targetLayer}/index.ts instead`);
      }
    }
    graph.set(file, edges);
  }
  problems.push(...findCycles(graph));
  return problems;
}

function findCycles(graph: Map<string, string[]>): string[] {
  const cycles: string[] = [];
  const state = new Map<string, 'visiting' | 'done'>();
  const stack: string[] = [];
  const visit = (file: string): void => {
    state.set(file, 'visiting');
    stack.push(file);
    for (const next of graph.get(file) ?? []) {
      if (!graph.has(next)) continue;
      if (state.get(next) === 'visiting')
        cycles.push(`import cycle: ${[...stack.slice(stack.indexOf(next)), next].join(' -> ')}`);
      else if (!state.has(next)) visit(next);
    }
    stack.pop();
    state.set(file, 'done');
  };
  for (const file of graph.keys()) if (!state.has(file)) visit(file);
  return cycles;
}
