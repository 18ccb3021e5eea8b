import { readFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { z } from 'zod';
import { parseAt } from '../../common/index.ts';
import { defaultRuleBook, readNetworkRules } from '../../backends/index.ts';
import { envService } from '../../env/index.ts';
import {
  Controller,
  NodeAgent,
  Platform,
  defaultDataDir,
  type LocalPlatformOptions,
  type PlatformClient,
} from '../../platform/index.ts';
import {
  LOG_OPTIONS,
  durationMs,
  nonNegativeInt,
  parseCommandArgs,
  positiveInt,
  serverLogger,
  text,
} from '../args.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/** Where a cluster client points: `SANDGYM_PLATFORM=grpc://controller:7443` plus `SANDGYM_TOKEN`. */
const PLATFORM_VARIABLE = 'SANDGYM_PLATFORM';

/**
 * The platform a command works on: the cluster named by $SANDGYM_PLATFORM (with $SANDGYM_TOKEN),
 * else the embedded one on this host.
 */
export async function openPlatform(local: LocalPlatformOptions = {}): Promise<PlatformClient> {
  const url = process.env[PLATFORM_VARIABLE];
  if (!url) return Platform.local(local);
  const token = process.env['SANDGYM_TOKEN'];
  if (!token)
    throw new UsageError(`${PLATFORM_VARIABLE} is set: also set SANDGYM_TOKEN to your project's token`);
  return Platform.connect(url, { token });
}

/** The node token: from a file (so it stays out of `ps`), else $SANDGYM_NODE_TOKEN. */
async function nodeToken(command: string, file: string | undefined): Promise<string> {
  const token = file ? (await readFile(file, 'utf8')).trim() : process.env['SANDGYM_NODE_TOKEN'];
  if (!token) {
    throw new UsageError(
      `sandgym ${command}: no node token; set SANDGYM_NODE_TOKEN or pass --node-token-file FILE (the same on every node and controller)`,
    );
  }
  return token;
}

/** A default node id from the host name: lowercase letters and digits, as sandbox ids need. */
function defaultNodeId(): string {
  return (
    hostname()
      .toLowerCase()
      .replace(/[^a-z0-9]/g, '')
      .slice(0, 32) || 'node'
  );
}

/** Serves until SIGINT or SIGTERM, then shuts down cleanly. */
function serveUntilSignalled(close: () => Promise<void>): Promise<number> {
  return new Promise((resolve) => {
    const stop = (): void => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      void close().then(
        () => resolve(EXIT.ok),
        (error: unknown) => {
          console.error(`sandgym: shutdown failed: ${String(error)}`);
          resolve(EXIT.infrastructure);
        },
      );
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
}

/** Warm latency-class shells a node keeps by default: enough to absorb a small burst. */
const DEFAULT_NODE_WARM_POOL = 8;

/** `sandgym node --listen ADDR [--data-dir D] [--store S] ...`: a node agent. */
export async function nodeCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('node', args, {
    ...LOG_OPTIONS,
    listen: { type: 'string' },
    'data-dir': { type: 'string' },
    'trajectory-retention': { type: 'string' },
    store: { type: 'string' },
    'node-id': { type: 'string' },
    'node-token-file': { type: 'string' },
    'max-sandboxes': { type: 'string' },
    'memory-mib': { type: 'string' },
    overcommit: { type: 'string' },
    'free-floor-mib': { type: 'string' },
    'warm-pool': { type: 'string' },
    'warm-pool-best-effort': { type: 'string' },
    'net-rules': { type: 'string' },
    'task-root': { type: 'string' },
  });
  const listen = text(parsed, 'listen');
  if (!listen) throw new UsageError('sandgym node: give --listen HOST:PORT (port 0 picks a free one)');
  const token = await nodeToken('node', text(parsed, 'node-token-file'));
  const nodeId = text(parsed, 'node-id') ?? defaultNodeId();
  const maxSandboxes = positiveInt('max-sandboxes', text(parsed, 'max-sandboxes'));
  const memoryCapacityMib = positiveInt('memory-mib', text(parsed, 'memory-mib'));
  const freeFloorMib = positiveInt('free-floor-mib', text(parsed, 'free-floor-mib'));
  const overcommitText = text(parsed, 'overcommit');
  const overcommit = overcommitText === undefined ? undefined : Number(overcommitText);
  if (overcommit !== undefined && !(overcommit >= 1 && overcommit <= 100)) {
    throw new UsageError(
      `sandgym node: --overcommit must be a number from 1 to 100, got "${overcommitText}"`,
    );
  }
  const warmPool = {
    latency: nonNegativeInt('warm-pool', text(parsed, 'warm-pool')) ?? DEFAULT_NODE_WARM_POOL,
    best_effort: nonNegativeInt('warm-pool-best-effort', text(parsed, 'warm-pool-best-effort')) ?? 0,
  };
  const logger = serverLogger(parsed, 'node');
  const storeDir = text(parsed, 'store');
  const trajectoryRetentionMs = durationMs('trajectory-retention', text(parsed, 'trajectory-retention'));
  const platform = await Platform.local({
    dataDir: text(parsed, 'data-dir') ?? defaultDataDir(),
    nodeId,
    logger,
    durable: true,
    warmPool,
    ...(trajectoryRetentionMs ? { trajectoryRetentionMs } : {}),
    ...(storeDir ? { storeDir } : {}),
    networkRules: text(parsed, 'net-rules')
      ? await readNetworkRules(text(parsed, 'net-rules'))
      : await defaultRuleBook(),
  });
  const node = await NodeAgent.start(platform, {
    listen,
    token,
    logger,
    ...(maxSandboxes ? { maxSandboxes } : {}),
    ...(memoryCapacityMib ? { memoryCapacityMib } : {}),
    ...(overcommit ? { overcommit } : {}),
    ...(freeFloorMib ? { freeFloorMib } : {}),
    // gym environments served to clients in any language (the Envs service)
    services: (agent) => {
      const taskRoot = text(parsed, 'task-root');
      return [
        envService((project) => agent.clientFor(project), { nodeId, ...(taskRoot ? { taskRoot } : {}) }),
      ];
    },
  }).catch(async (error: unknown) => {
    await platform.close();
    throw error;
  });
  // one JSON line on stdout, so a script that asked for port 0 learns which port it got
  console.log(JSON.stringify({ role: 'node', nodeId, port: node.port }));
  return serveUntilSignalled(() => node.close());
}

const grantsFileSchema = z.strictObject({
  tokens: z.record(
    z.string().min(16, 'tokens are at least 16 characters'),
    z.strictObject({
      project: z.string().regex(/^[a-z0-9][a-z0-9_-]{0,63}$/, 'project names are a-z, 0-9, _ and -'),
      maxSandboxes: z.number().int().positive(),
    }),
  ),
});

/** `sandgym controller --listen ADDR --nodes ADDR,... --grants FILE`: a controller replica. */
export async function controllerCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('controller', args, {
    ...LOG_OPTIONS,
    listen: { type: 'string' },
    nodes: { type: 'string' },
    grants: { type: 'string' },
    'node-token-file': { type: 'string' },
    'poll-ms': { type: 'string' },
    'queue-timeout-ms': { type: 'string' },
  });
  const listen = text(parsed, 'listen');
  const nodes = (text(parsed, 'nodes') ?? '').split(',').filter(Boolean);
  const grantsFile = text(parsed, 'grants');
  if (!listen) throw new UsageError('sandgym controller: give --listen HOST:PORT');
  if (nodes.length === 0) throw new UsageError('sandgym controller: give --nodes HOST:PORT,HOST:PORT,...');
  if (!grantsFile) {
    throw new UsageError(
      'sandgym controller: give --grants FILE, JSON like {"tokens": {"<token>": {"project": "p", "maxSandboxes": 100}}}',
    );
  }
  const raw = await readFile(grantsFile, 'utf8').catch((error: unknown) => {
    throw new UsageError(`sandgym controller: cannot read --grants ${grantsFile}: ${String(error)}`);
  });
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (error) {
    throw new UsageError(`sandgym controller: ${grantsFile} is not JSON: ${String(error)}`);
  }
  const grants = parseAt(grantsFileSchema, json, `grants file ${grantsFile}`).tokens;
  const pollMs = positiveInt('poll-ms', text(parsed, 'poll-ms'));
  const queueTimeoutMs = positiveInt('queue-timeout-ms', text(parsed, 'queue-timeout-ms'));
  const controller = await Controller.start({
    listen,
    nodes,
    nodeToken: await nodeToken('controller', text(parsed, 'node-token-file')),
    grants,
    logger: serverLogger(parsed, 'controller'),
    ...(pollMs ? { pollMs } : {}),
    ...(queueTimeoutMs ? { queueTimeoutMs } : {}),
  });
  console.log(JSON.stringify({ role: 'controller', port: controller.port }));
  return serveUntilSignalled(() => controller.close());
}
