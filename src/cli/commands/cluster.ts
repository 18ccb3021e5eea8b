import { join } from 'node:path';
import { hostname } from 'node:os';
import { defaultRuleBook, readNetworkRules } from '../../backends/index.ts';
import { envService } from '../../env/index.ts';
import {
  Controller,
  NodeAgent,
  Platform,
  defaultDataDir,
  readGrantsFile,
  reloadGrantsOnHangup,
  type LocalPlatformOptions,
  type RemotePlatform,
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
import {
  CLUSTER_SERVER_OPTIONS,
  clientTls,
  etcdOption,
  metricsToken,
  nodeToken,
  serverTls,
} from './cluster-options.ts';
import { nodeDrainCommand } from './node-drain.ts';

/** Where a cluster client points: `SANDGYM_PLATFORM=grpc://controller:7443` plus `SANDGYM_TOKEN`. */
const PLATFORM_VARIABLE = 'SANDGYM_PLATFORM';

/**
 * The platform a command works on: the cluster named by $SANDGYM_PLATFORM (with $SANDGYM_TOKEN),
 * else the embedded one on this host.
 */
export async function openPlatform(local: LocalPlatformOptions = {}): Promise<PlatformClient> {
  return (await openCluster()) ?? Platform.local(local);
}

/** The cluster client of $SANDGYM_PLATFORM, or undefined when it is not set (this host's platform). */
export async function openCluster(): Promise<RemotePlatform | undefined> {
  const url = process.env[PLATFORM_VARIABLE];
  if (!url) return undefined;
  const token = process.env['SANDGYM_TOKEN'];
  if (!token)
    throw new UsageError(`${PLATFORM_VARIABLE} is set: also set SANDGYM_TOKEN to your project's token`);
  const tls = await clientTls();
  return Platform.connect(url, { token, ...(tls ? { tls } : {}) });
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
export function serveUntilSignalled(close: () => Promise<void>): Promise<number> {
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

/** The options of `sandgym node` (the Kubernetes manifests are checked against them). */
export const NODE_OPTIONS = {
  ...LOG_OPTIONS,
  ...CLUSTER_SERVER_OPTIONS,
  advertise: { type: 'string' },
  'lease-ttl': { type: 'string' },
  listen: { type: 'string' },
  'data-dir': { type: 'string' },
  'trajectory-retention': { type: 'string' },
  'idle-ttl': { type: 'string' },
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
  'control-plane': { type: 'string' },
  'task-root': { type: 'string' },
  'max-in-flight-mib': { type: 'string' },
  'max-in-flight-total-mib': { type: 'string' },
  'max-store-mib': { type: 'string' },
} as const;

/**
 * How long a node keeps a sandbox outside a run without a request by default: a day, long past
 * any episode, short of a crashed client's sandboxes holding the node for good.
 */
const DEFAULT_NODE_IDLE_TTL = '24h';

/** What each project may hold in the layer store by default on a node: its diffs, checkpoints, builds. */
const DEFAULT_NODE_STORE_MIB = 16 * 1024;

const MIB = 2 ** 20;

/** `sandgym node --listen ADDR [--data-dir D] [--store S] ...`: a node agent. */
export async function nodeCommand(args: string[]): Promise<number> {
  if (args[0] === 'drain' || args[0] === 'undrain') return nodeDrainCommand(args[0], args.slice(1));
  const parsed = parseCommandArgs('node', args, NODE_OPTIONS);
  const listen = text(parsed, 'listen');
  if (!listen) throw new UsageError('sandgym node: give --listen HOST:PORT (port 0 picks a free one)');
  const token = await nodeToken('node', text(parsed, 'node-token-file'));
  const nodeId = text(parsed, 'node-id') ?? defaultNodeId();
  const maxSandboxes = positiveInt('max-sandboxes', text(parsed, 'max-sandboxes'));
  const memoryCapacityMib = positiveInt('memory-mib', text(parsed, 'memory-mib'));
  const freeFloorMib = positiveInt('free-floor-mib', text(parsed, 'free-floor-mib'));
  const inFlightMib = positiveInt('max-in-flight-mib', text(parsed, 'max-in-flight-mib'));
  const inFlightTotalMib = positiveInt('max-in-flight-total-mib', text(parsed, 'max-in-flight-total-mib'));
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
  const tls = await serverTls('node', parsed);
  const etcd = etcdOption(parsed, tls);
  const leaseTtlMs = durationMs('lease-ttl', text(parsed, 'lease-ttl'));
  const advertise = text(parsed, 'advertise');
  if (!etcd && (leaseTtlMs || advertise))
    throw new UsageError('sandgym node: --advertise and --lease-ttl are for joining through --etcd');
  if (etcd && !advertise && /^(0\.0\.0\.0|\[::\]|):/.test(listen)) {
    throw new UsageError(
      'sandgym node: it listens on every address; give --advertise HOST:PORT, the address controllers dial',
    );
  }
  const metricsListen = text(parsed, 'metrics-listen');
  const scrapeToken = await metricsToken('node', text(parsed, 'metrics-token-file'));
  const controlPlane = (text(parsed, 'control-plane') ?? '').split(',').filter(Boolean);
  const storeDir = text(parsed, 'store');
  const trajectoryRetentionMs = durationMs('trajectory-retention', text(parsed, 'trajectory-retention'));
  const idleTtl = text(parsed, 'idle-ttl') ?? DEFAULT_NODE_IDLE_TTL;
  // 0 turns it off: sandboxes outside runs then stay until they are destroyed
  const defaultIdleTtlMs = idleTtl.trim() === '0' ? undefined : durationMs('idle-ttl', idleTtl);
  const storeMib = positiveInt('max-store-mib', text(parsed, 'max-store-mib')) ?? DEFAULT_NODE_STORE_MIB;
  const dataDir = text(parsed, 'data-dir') ?? defaultDataDir();
  const platform = await Platform.local({
    dataDir,
    nodeId,
    logger,
    durable: true,
    warmPool,
    maxStoreBytes: storeMib * MIB,
    ...(trajectoryRetentionMs ? { trajectoryRetentionMs } : {}),
    ...(defaultIdleTtlMs ? { defaultIdleTtlMs } : {}),
    ...(storeDir ? { storeDir } : {}),
    ...(controlPlane.length ? { controlPlane } : {}),
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
    ...(inFlightMib ? { maxInFlightBytes: inFlightMib * MIB } : {}),
    ...(inFlightTotalMib ? { maxInFlightTotalBytes: inFlightTotalMib * MIB } : {}),
    ...(tls ? { tls } : {}),
    ...(metricsListen ? { metricsListen } : {}),
    ...(scrapeToken ? { metricsToken: scrapeToken } : {}),
    ...(etcd
      ? {
          etcd: {
            ...etcd,
            ...(advertise ? { advertise } : {}),
            ...(leaseTtlMs ? { leaseTtlSeconds: Math.max(1, Math.ceil(leaseTtlMs / 1000)) } : {}),
          },
        }
      : {}),
    // gym environments served to clients in any language (the Envs service)
    services: (agent) => {
      const taskRoot = text(parsed, 'task-root');
      return [
        envService((project, limits) => agent.clientFor(project, limits), {
          nodeId,
          ...(taskRoot ? { taskRoot } : {}),
          // its sandboxes are durable: a restarted node carries its envs on too
          stateDir: join(dataDir, 'served-envs'),
        }),
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

/** The options of `sandgym controller`. */
export const CONTROLLER_OPTIONS = {
  ...LOG_OPTIONS,
  ...CLUSTER_SERVER_OPTIONS,
  listen: { type: 'string' },
  nodes: { type: 'string' },
  grants: { type: 'string' },
  'node-token-file': { type: 'string' },
  'poll-ms': { type: 'string' },
  'queue-timeout-ms': { type: 'string' },
} as const;

/** `sandgym controller --listen ADDR (--nodes ADDR,... | --etcd URL,...) --grants FILE`: a controller replica. */
export async function controllerCommand(args: string[]): Promise<number> {
  const parsed = parseCommandArgs('controller', args, CONTROLLER_OPTIONS);
  const listen = text(parsed, 'listen');
  const nodes = (text(parsed, 'nodes') ?? '').split(',').filter(Boolean);
  const grantsFile = text(parsed, 'grants');
  if (!listen) throw new UsageError('sandgym controller: give --listen HOST:PORT');
  const tls = await serverTls('controller', parsed);
  const etcd = etcdOption(parsed, tls);
  if ((nodes.length === 0) === !etcd) {
    throw new UsageError(
      'sandgym controller: give either --nodes HOST:PORT,HOST:PORT,... (one controller, a fixed set) or --etcd URL,... (membership and quotas in etcd)',
    );
  }
  const metricsListen = text(parsed, 'metrics-listen');
  const scrapeToken = await metricsToken('controller', text(parsed, 'metrics-token-file'));
  if (!grantsFile) {
    throw new UsageError(
      'sandgym controller: give --grants FILE, JSON like {"tokens": {"<token>": {"project": "p", "maxSandboxes": 100, "network": ["mirror:debian", "dns"]}}}',
    );
  }
  const grants = await readGrantsFile(grantsFile);
  const pollMs = positiveInt('poll-ms', text(parsed, 'poll-ms'));
  const queueTimeoutMs = positiveInt('queue-timeout-ms', text(parsed, 'queue-timeout-ms'));
  const logger = serverLogger(parsed, 'controller');
  const controller = await Controller.start({
    listen,
    ...(etcd ? { etcd } : { nodes }),
    ...(tls ? { tls } : {}),
    ...(metricsListen ? { metricsListen } : {}),
    ...(scrapeToken ? { metricsToken: scrapeToken } : {}),
    nodeToken: await nodeToken('controller', text(parsed, 'node-token-file')),
    grants,
    logger,
    ...(pollMs ? { pollMs } : {}),
    ...(queueTimeoutMs ? { queueTimeoutMs } : {}),
  });
  // `kill -HUP` reads the grants file again: new tokens, quotas and rules without a restart
  const stopReloading = reloadGrantsOnHangup(grantsFile, (next) => controller.replaceGrants(next), logger);
  console.log(JSON.stringify({ role: 'controller', port: controller.port }));
  return serveUntilSignalled(() => {
    stopReloading();
    return controller.close();
  });
}
