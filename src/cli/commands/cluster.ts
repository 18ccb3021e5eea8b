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
  HOST_MEMORY_MIB,
  LOG_OPTIONS,
  durationMs,
  listenAddress,
  numberOf,
  serverLogger,
  text,
} from '../args.ts';
import { parseCommand, type CommandSpec } from '../command-spec.ts';
import { EXIT, UsageError } from '../exit-codes.ts';
import {
  CLUSTER_SERVER_OPTIONS,
  clientTls,
  etcdOption,
  metricsToken,
  nodeToken,
  serverTls,
} from './cluster-options.ts';

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

/**
 * How long a node keeps a sandbox outside a run without a request by default: a day, long past
 * any episode, short of a crashed client's sandboxes holding the node for good.
 */
const DEFAULT_NODE_IDLE_TTL = '24h';

/** What each project may hold in the layer store by default on a node: its diffs, checkpoints, builds. */
const DEFAULT_NODE_STORE_MIB = 16 * 1024;

/** `sandgym node` (the Kubernetes manifests are checked against its options). */
export const NODE_COMMAND = {
  name: 'node',
  summary: 'a node agent (cluster mode); logs JSON lines on stderr',
  details:
    'The node token comes from --node-token-file or $SANDGYM_NODE_TOKEN. It prints one JSON line,\n' +
    '{"role":"node","nodeId":...,"port":...}, on stdout once it listens (port 0 picks a free one).\n' +
    'node drain and node undrain take nodes out of placement and back (sandgym node drain --help).',
  options: {
    listen: { type: 'string', value: 'HOST:PORT', description: 'where it listens' },
    'data-dir': { type: 'string', value: 'DIR', description: 'its data folder (default $SANDGYM_DATA_DIR)' },
    store: { type: 'string', value: 'DIR', description: 'its layer store (default $SANDGYM_STORE)' },
    'node-id': {
      type: 'string',
      value: 'ID',
      description: 'its id, in every sandbox id (default from the host name)',
    },
    'max-sandboxes': { type: 'integer', range: [1, 100_000], description: 'the most sandboxes at once' },
    'memory-mib': {
      type: 'integer',
      range: [16, HOST_MEMORY_MIB],
      description: "the memory sandboxes may commit; without it, this host's",
    },
    overcommit: {
      type: 'number',
      range: [1, 100],
      description: 'how far commitments may exceed --memory-mib',
    },
    'free-floor-mib': {
      type: 'integer',
      range: [1, HOST_MEMORY_MIB],
      description: 'the free memory below which it takes no more sandboxes',
    },
    'warm-pool': {
      type: 'integer',
      range: [0, 1024],
      default: DEFAULT_NODE_WARM_POOL,
      description: 'warm latency-class shells kept ready',
    },
    'warm-pool-best-effort': {
      type: 'integer',
      range: [0, 1024],
      default: 0,
      description: 'warm best-effort shells kept ready',
    },
    'net-rules': {
      type: 'string',
      value: 'FILE',
      description: 'JSON {"mirror:debian": ["IP[/N][:PORT]", ...]} (or $SANDGYM_NET_RULES)',
    },
    'control-plane': {
      type: 'string',
      value: 'IP[/N][:PORT],...',
      description: 'controllers etc.: no sandbox rule ever reaches them',
    },
    'task-root': {
      type: 'string',
      value: 'DIR',
      description: 'tasks the Envs service may serve, by path under DIR',
    },
    'trajectory-retention': {
      type: 'string',
      value: 'DURATION',
      description: "how long an ended sandbox's step log stays for audit, e.g. 7d",
    },
    'idle-ttl': {
      type: 'string',
      value: 'DURATION',
      default: DEFAULT_NODE_IDLE_TTL,
      description:
        'how long a sandbox outside a run may go without a request before it is reclaimed; 0: never',
    },
    'max-in-flight-mib': {
      type: 'integer',
      range: [1, 65_536],
      default: 256,
      description: 'request bodies held at once per project',
    },
    'max-in-flight-total-mib': {
      type: 'integer',
      range: [1, 1_048_576],
      description: 'request bodies held at once, all projects',
    },
    'max-store-mib': {
      type: 'integer',
      range: [1, 1 << 30],
      default: DEFAULT_NODE_STORE_MIB,
      description: 'what each project may hold in the layer store',
    },
    advertise: {
      type: 'string',
      value: 'HOST:PORT',
      description: 'with --etcd: the address controllers dial',
    },
    'lease-ttl': {
      type: 'string',
      value: 'DURATION',
      description: 'with --etcd: its membership lease, e.g. 10s',
    },
    ...CLUSTER_SERVER_OPTIONS,
    ...LOG_OPTIONS,
  },
} as const satisfies CommandSpec;

const MIB = 2 ** 20;

/** `sandgym node --listen ADDR [--data-dir D] [--store S] ...`: a node agent. */
export async function nodeCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(NODE_COMMAND, args);
  const listen = text(parsed, 'listen');
  if (!listen) throw new UsageError('sandgym node: give --listen HOST:PORT (port 0 picks a free one)');
  listenAddress('listen', listen);
  const token = await nodeToken('node', text(parsed, 'node-token-file'));
  const nodeId = text(parsed, 'node-id') ?? defaultNodeId();
  const maxSandboxes = numberOf(parsed, 'max-sandboxes');
  const memoryCapacityMib = numberOf(parsed, 'memory-mib');
  const freeFloorMib = numberOf(parsed, 'free-floor-mib');
  const inFlightMib = numberOf(parsed, 'max-in-flight-mib');
  const inFlightTotalMib = numberOf(parsed, 'max-in-flight-total-mib');
  const overcommit = numberOf(parsed, 'overcommit');
  const warmPool = {
    latency: numberOf(parsed, 'warm-pool') ?? DEFAULT_NODE_WARM_POOL,
    best_effort: numberOf(parsed, 'warm-pool-best-effort') ?? 0,
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
  const storeMib = numberOf(parsed, 'max-store-mib') ?? DEFAULT_NODE_STORE_MIB;
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

/** `sandgym controller` (the Kubernetes manifests are checked against its options). */
export const CONTROLLER_COMMAND = {
  name: 'controller',
  summary: 'a controller replica (cluster mode): places sandboxes on nodes, within grants',
  details:
    'Give --nodes (one controller, a fixed set) or --etcd (membership and quotas in etcd). The grants\n' +
    'file maps tokens to {project, maxSandboxes, network: [rules it may use], maxInFlightBytes?,\n' +
    'maxStoreBytes?}. It prints {"role":"controller","port":...} on stdout once it listens.',
  options: {
    listen: { type: 'string', value: 'HOST:PORT', description: 'where it listens' },
    nodes: { type: 'string', value: 'HOST:PORT,...', description: 'the nodes, without etcd' },
    grants: { type: 'string', value: 'FILE', description: 'JSON: which token may do what' },
    'poll-ms': { type: 'integer', range: [1, 3_600_000], description: "how often it polls nodes' status" },
    'queue-timeout-ms': {
      type: 'integer',
      range: [1, 86_400_000],
      description: 'how long a create waits for room before it is refused',
    },
    ...CLUSTER_SERVER_OPTIONS,
    ...LOG_OPTIONS,
  },
} as const satisfies CommandSpec;

/** `sandgym controller --listen ADDR (--nodes ADDR,... | --etcd URL,...) --grants FILE`: a controller replica. */
export async function controllerCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(CONTROLLER_COMMAND, args);
  const listen = text(parsed, 'listen');
  const nodes = (text(parsed, 'nodes') ?? '').split(',').filter(Boolean);
  const grantsFile = text(parsed, 'grants');
  if (!listen) throw new UsageError('sandgym controller: give --listen HOST:PORT');
  listenAddress('listen', listen);
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
  const pollMs = numberOf(parsed, 'poll-ms');
  const queueTimeoutMs = numberOf(parsed, 'queue-timeout-ms');
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
