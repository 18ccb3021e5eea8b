import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { z } from 'zod';
import { isSandgymError } from '../src/common/index.ts';
import { packageRoot } from '../src/backends/index.ts';
import {
  Platform,
  connectEtcd,
  type EtcdClient,
  type PlatformClient,
  type Sandbox,
} from '../src/platform/index.ts';
import { startEtcdCluster, type EtcdCluster } from './etcd-cluster.ts';
import { LineProcess } from './line-process.ts';
import type { SimulatorProcessConfig } from './node-simulator-process.ts';
import {
  atATime,
  compared,
  hostInfo,
  quantile,
  type BenchOptions,
  type BenchReport,
  type Metric,
} from './report.ts';
import { Stack } from './stack.ts';

const list = z
  .string()
  .regex(/^\d+(,\d+)*$/, 'a comma-separated list of counts')
  .transform((text) => text.split(',').map(Number));
const whole = z.coerce.number().int().positive();

/**
 * The shape of a run, from `sandgym bench cluster-scale --FLAG VALUE ...`. The defaults finish in
 * a few minutes on a 2-core machine; DSec's unit is
 * `--nodes 160 --processes 4 --creates 32000 --in-flight 16,256,1024 --hold 380000`.
 */
const shapeSchema = z.strictObject({
  nodes: whole.default(16),
  /** Processes the simulated nodes are spread over. */
  processes: whole.default(2),
  /** Creates in each burst, spread over the run's projects. */
  creates: whole.default(500),
  'in-flight': list.default([16, 256]),
  projects: list.default([1, 16]),
  /** What a simulated node takes to make a sandbox once admitted. */
  'create-latency-ms': z.coerce.number().nonnegative().default(2),
  /**
   * Each project's quota, as a multiple of its share of the burst: 1 fills every quota exactly
   * (the worst case for quota blocks), more leaves the headroom quotas usually have.
   */
  'quota-share': z.coerce.number().min(1).default(1),
  /** Live records for the create measured at size (against one at 0 live). */
  hold: z.coerce.number().int().nonnegative().default(10_000),
  /** Creates timed at 0 live and at `hold` live. */
  'hold-samples': whole.default(100),
});
type Shape = z.output<typeof shapeSchema>;

/** The flags `sandgym bench cluster-scale` takes. */
export const CLUSTER_SCALE_FLAGS = Object.keys(shapeSchema.shape);

const CONTROLLERS = 2;
const REQUEST = { resources: { memoryMib: 32 } };
/** How many creates past the quota each quota run sends to prove none gets in. */
const PROBE = 32;

/** The projects of a run of `count` projects, each with `share` times its share of the burst as its quota. */
function projectsOf(count: number, creates: number, share: number): { name: string; quota: number }[] {
  return Array.from({ length: count }, (_, i) => ({
    name: `p${count}x${i}`,
    quota: Math.ceil((share * creates) / count),
  }));
}

/** Everything a run talks to. */
interface Cluster {
  etcd: EtcdCluster;
  admin: EtcdClient;
  simulators: LineProcess[];
  controllers: LineProcess[];
  /** Per project, a client of each controller replica. */
  clients: Map<string, PlatformClient[]>;
}

/** One burst's figures. */
interface Burst {
  made: number;
  /** Creates within the quota that were refused all the same (a contended guard key). */
  refused: number;
  perSecond: number;
  latencies: number[];
  etcdWrites: number;
  conflicts: number;
  controllerCpuSeconds: number;
  controllerRssMib: number;
  liveReached: number;
  overAdmitted: number;
  /** What the nodes' quota ledgers and creates did in the burst, summed (see QuotaProfile). */
  profile: Record<string, number>;
}

/**
 * cluster-scale: creates through 2 controller replicas (processes of their own) to simulated nodes
 * (benchmarks/node-simulator.ts) on a real 3-member etcd on loopback, in bursts at several
 * in-flight levels for 1 and 16 projects, with the nodes' quota claims in etcd on and off; then a
 * create with many records live against one at 0 live. Each project's quota is its share of the
 * burst (times --quota-share), and every quota run ends with creates past it; over-admission is
 * what etcd then counts beyond a quota.
 */
export async function benchClusterScale(options: BenchOptions): Promise<BenchReport> {
  const shape = shapeSchema.parse(options.flags ?? {});
  const stack = new Stack();
  const dir = await mkdtemp(join(tmpdir(), 'sandgym-cluster-scale-'));
  stack.add(() => rm(dir, { recursive: true, force: true }));
  try {
    const cluster = await startCluster(shape, dir, stack, options);
    const metrics: Record<string, Metric> = {};
    for (const projects of shape.projects) {
      for (const inFlight of shape['in-flight']) {
        const at = `${projects}p_${inFlight}if`;
        options.progress(
          `cluster-scale: ${shape.creates} creates, ${projects} project(s), ${inFlight} in flight`,
        );
        const run = (quotasOff: boolean): Promise<Burst> =>
          burst(
            cluster,
            projectsOf(projects, shape.creates, shape['quota-share']),
            shape.creates,
            inFlight,
            quotasOff,
          );
        const on = await run(false);
        const off = await run(true);
        options.progress(
          `cluster-scale: ${on.perSecond}/s with quotas, ${off.perSecond}/s without; ${on.conflicts} conflicts`,
        );
        Object.assign(metrics, burstMetrics(at, on, off));
      }
    }
    if (shape.hold > 0) Object.assign(metrics, await atSize(cluster, shape, options));
    return { bench: 'cluster-scale', host: hostInfo(), metrics };
  } finally {
    await stack.close();
  }
}

async function startCluster(
  shape: Shape,
  dir: string,
  stack: Stack,
  options: BenchOptions,
): Promise<Cluster> {
  options.progress(
    `cluster-scale: a 3-member etcd, ${shape.nodes} simulated nodes in ${shape.processes} processes`,
  );
  const etcd = await startEtcdCluster(join(dir, 'etcd'), 3);
  stack.add(async () => etcd[Symbol.asyncDispose]());
  const admin = await connectEtcd({ endpoints: etcd.endpoints });
  stack.add(() => Promise.resolve(admin.close()));
  const nodeToken = randomBytes(32).toString('hex');
  const env = { ...process.env, SANDGYM_NODE_TOKEN: nodeToken };
  const dist = join(packageRoot(), 'dist');

  const most = Math.max(shape.creates + PROBE, shape.hold + shape['hold-samples']);
  const simulators: LineProcess[] = [];
  for (let p = 0; p < shape.processes; p++) {
    const first = Math.floor((p * shape.nodes) / shape.processes);
    const config: SimulatorProcessConfig = {
      endpoints: etcd.endpoints,
      prefix: 's',
      first,
      count: Math.floor(((p + 1) * shape.nodes) / shape.processes) - first,
      // twice each node's share, so placement's imbalance never refuses a create
      capacity: Math.ceil((2 * most) / shape.nodes) + 16,
      createLatencyMs: shape['create-latency-ms'],
      quotasOff: false,
      leaseTtlSeconds: 10,
    };
    const simulator = await LineProcess.start(
      process.execPath,
      [join(dist, 'benchmarks', 'node-simulator-process.js'), JSON.stringify(config)],
      env,
    );
    stack.add(() => simulator.stop());
    simulators.push(simulator);
  }

  const projects = [
    ...shape.projects.flatMap((count) => projectsOf(count, shape.creates, shape['quota-share'])),
    ...Object.values(heldProjects(shape)),
  ];
  const tokens = new Map(projects.map(({ name }) => [name, randomBytes(16).toString('hex')]));
  const grants = join(dir, 'grants.json');
  await writeFile(
    grants,
    JSON.stringify({
      tokens: Object.fromEntries(
        projects.map(({ name, quota }) => [tokens.get(name)!, { project: name, maxSandboxes: quota }]),
      ),
    }),
  );
  const controllers: LineProcess[] = [];
  for (let i = 0; i < CONTROLLERS; i++) {
    const controller = await LineProcess.start(
      process.execPath,
      [
        join(dist, 'src', 'cli', 'main.js'),
        'controller',
        '--listen',
        '127.0.0.1:0',
        '--etcd',
        etcd.endpoints.join(','),
        '--grants',
        grants,
        '--log-level',
        'error',
        '--queue-timeout-ms',
        '120000',
      ],
      env,
    );
    stack.add(() => controller.stop());
    controllers.push(controller);
  }
  const clients = new Map<string, PlatformClient[]>();
  for (const { name } of projects) {
    const replicas: PlatformClient[] = [];
    for (const controller of controllers) {
      const { port } = z.object({ port: z.number() }).parse(controller.ready);
      const client = await Platform.connect(`grpc://127.0.0.1:${port}`, { token: tokens.get(name)! });
      stack.add(() => client.close());
      replicas.push(client);
    }
    clients.set(name, replicas);
  }
  return { etcd, admin, simulators, controllers, clients };
}

/**
 * The projects of the at-size comparison: one it fills with `hold` records, and one it leaves
 * empty; both have the same room beyond that for the timed creates (`--quota-share` times them),
 * so the two differ in live records only, not in how near their quota's edge they are.
 */
function heldProjects(shape: Shape): {
  empty: { name: string; quota: number };
  full: { name: string; quota: number };
} {
  const room = Math.ceil(shape['quota-share'] * shape['hold-samples']);
  return { empty: { name: 'held0', quota: room }, full: { name: 'held', quota: shape.hold + room } };
}

const statsSchema = z.object({
  live: z.number(),
  conflicts: z.number(),
  /** The nodes' quota profiles and create timings (QuotaProfile, SimulatedNode.timing), summed. */
  profile: z.record(z.string(), z.number()),
});
type Stats = z.infer<typeof statsSchema>;

async function simulatorStats(cluster: Cluster): Promise<Stats> {
  const all = await Promise.all(
    cluster.simulators.map(async (s) => statsSchema.parse(await s.request({ stats: true }))),
  );
  return all.reduce((sum, one) => ({
    live: sum.live + one.live,
    conflicts: sum.conflicts + one.conflicts,
    profile: sumOf(sum.profile, one.profile, 1),
  }));
}

/** `a + sign * b`, field by field. */
function sumOf(a: Record<string, number>, b: Record<string, number>, sign: 1 | -1): Record<string, number> {
  const total = { ...a };
  for (const [key, value] of Object.entries(b)) total[key] = (total[key] ?? 0) + sign * value;
  return total;
}

/** Raft proposals etcd committed so far: one per write transaction (a put, a delete, a txn). */
async function etcdWrites(cluster: Cluster): Promise<number> {
  const text = await (await fetch(`${cluster.etcd.endpoints[0]}/metrics`)).text();
  return Number(/^etcd_server_proposals_committed_total (\S+)$/m.exec(text)?.[1] ?? Number.NaN);
}

const heldCount = (cluster: Cluster, project: string): Promise<number> =>
  cluster.admin.getAll().prefix(`/sandgym/quota/${project}/held/`).count();

/**
 * `creates` creates spread over `projects` and both replicas, `inFlight` at a time; then (with
 * quotas) creates past every quota, which must all be refused; then every sandbox destroyed.
 */
async function burst(
  cluster: Cluster,
  projects: { name: string; quota: number }[],
  creates: number,
  inFlight: number,
  quotasOff: boolean,
): Promise<Burst> {
  await Promise.all(cluster.simulators.map((s) => s.request({ quotasOff })));
  const before = { stats: await simulatorStats(cluster), writes: await etcdWrites(cluster) };
  const cpuBefore = cluster.controllers.reduce((sum, c) => sum + c.cpuSeconds(), 0);
  const made: Sandbox[] = [];
  const latencies: number[] = [];
  const clientOf = (i: number): PlatformClient =>
    cluster.clients.get(projects[i % projects.length]!.name)![Math.floor(i / projects.length) % CONTROLLERS]!;
  const started = performance.now();
  let refused = 0;
  await atATime(creates, inFlight, async (i) => {
    const begun = performance.now();
    try {
      made.push(await clientOf(i).createSandbox(REQUEST));
      latencies.push(performance.now() - begun);
    } catch (error) {
      // within its quota, a create is refused only when the guard key is too contended to claim
      if (!isSandgymError(error, 'resource_exhausted')) throw error;
      refused++;
    }
  });
  const seconds = (performance.now() - started) / 1000;
  const controllerCpuSeconds = cluster.controllers.reduce((sum, c) => sum + c.cpuSeconds(), 0) - cpuBefore;
  const controllerRssMib = Math.max(...cluster.controllers.map((c) => c.rssMib()));
  const after = { stats: await simulatorStats(cluster), writes: await etcdWrites(cluster) };

  let overAdmitted = 0;
  if (!quotasOff) {
    const probes = await Promise.allSettled(
      Array.from({ length: PROBE }, (_, i) => clientOf(i).createSandbox(REQUEST)),
    );
    for (const probe of probes) {
      if (probe.status === 'fulfilled') made.push(probe.value);
      else if (!isSandgymError(probe.reason, 'resource_exhausted')) throw probe.reason;
    }
    for (const { name, quota } of projects)
      overAdmitted += Math.max(0, (await heldCount(cluster, name)) - quota);
  }
  const liveReached = (await simulatorStats(cluster)).live;
  await atATime(made.length, Math.min(inFlight, 256), (i) => made[i]!.close());
  return {
    made: creates - refused,
    refused,
    perSecond: Math.round((creates - refused) / seconds),
    latencies,
    etcdWrites: after.writes - before.writes,
    conflicts: after.stats.conflicts - before.stats.conflicts,
    controllerCpuSeconds,
    controllerRssMib,
    liveReached,
    overAdmitted,
    profile: sumOf(after.stats.profile, before.stats.profile, -1),
  };
}

function burstMetrics(at: string, on: Burst, off: Burst): Record<string, Metric> {
  const round = (n: number, places = 3): number => Math.round(n * 10 ** places) / 10 ** places;
  return {
    [`${at}_creates_per_s_quotas_vs_none`]: compared(on.perSecond, off.perSecond, 'creates/s'),
    [`${at}_p50_ms_quotas_vs_none`]: compared(quantile(on.latencies, 0.5), quantile(off.latencies, 0.5)),
    [`${at}_p99_ms_quotas_vs_none`]: compared(quantile(on.latencies, 0.99), quantile(off.latencies, 0.99)),
    [`${at}_etcd_txns_per_create_quotas_vs_none`]: compared(
      on.etcdWrites / on.made,
      off.etcdWrites / off.made,
      'txns',
    ),
    [`${at}_refused_within_quota`]: { value: on.refused, unit: 'creates' },
    [`${at}_conflict_retries_per_create`]: { value: round(on.conflicts / on.made), unit: 'retries' },
    [`${at}_controller_cpu_ms_per_create_quotas_vs_none`]: compared(
      (on.controllerCpuSeconds * 1000) / on.made,
      (off.controllerCpuSeconds * 1000) / off.made,
    ),
    [`${at}_controller_rss_mib`]: { value: Math.max(on.controllerRssMib, off.controllerRssMib), unit: 'MiB' },
    [`${at}_live_reached`]: { value: on.liveReached, unit: 'sandboxes' },
    [`${at}_over_admitted`]: { value: on.overAdmitted, unit: 'sandboxes' },
    ...profileMetrics(at, on.profile),
  };
}

/** Per create on a node: where a quota claim's time and etcd writes went. */
function profileMetrics(at: string, profile: Record<string, number>): Record<string, Metric> {
  const creates = profile['creates'] ?? 0;
  const per = (key: string): number => Math.round(((profile[key] ?? 0) / creates) * 1000) / 1000;
  const metrics: Record<string, Metric> = {};
  for (const key of ['claimMs', 'queuedMs', 'growMs', 'settleMs', 'createMs'])
    metrics[`${at}_node_${key.replace(/Ms$/, '')}_ms_per_create`] = { value: per(key), unit: 'ms' };
  for (const key of ['grows', 'conflicts', 'waitsForSpare', 'returnWrites', 'holdWrites'])
    metrics[`${at}_node_${key}_per_create`] = { value: per(key), unit: 'per create' };
  return metrics;
}

/** Creates one project makes with `hold` of its records live, against the same at 0 live. */
async function atSize(
  cluster: Cluster,
  shape: Shape,
  options: BenchOptions,
): Promise<Record<string, Metric>> {
  const samples = shape['hold-samples'];
  const { empty, full: project } = heldProjects(shape);
  let refused = 0;
  const profiles: Record<string, Metric> = {};
  const timed = async (name: string, at: string): Promise<number[]> => {
    const before = await simulatorStats(cluster);
    const clients = cluster.clients.get(name)!;
    const made: Sandbox[] = [];
    const latencies: number[] = [];
    await atATime(samples, 16, async (i) => {
      const begun = performance.now();
      try {
        made.push(await clients[i % CONTROLLERS]!.createSandbox(REQUEST));
        latencies.push(performance.now() - begun);
      } catch (error) {
        if (!isSandgymError(error, 'resource_exhausted')) throw error;
        refused++;
      }
    });
    Object.assign(
      profiles,
      profileMetrics(at, sumOf((await simulatorStats(cluster)).profile, before.profile, -1)),
    );
    await atATime(made.length, 16, (i) => made[i]!.close());
    return latencies;
  };
  await Promise.all(cluster.simulators.map((s) => s.request({ quotasOff: false })));
  options.progress(`cluster-scale: ${samples} creates at 0 live`);
  const atZero = await timed(empty.name, 'at_0_live');
  options.progress(`cluster-scale: filling ${shape.hold} records`);
  const share = (p: number): number =>
    Math.floor(shape.hold / cluster.simulators.length) + (p < shape.hold % cluster.simulators.length ? 1 : 0);
  await Promise.all(
    cluster.simulators.map((s, p) => s.request({ preload: { project: project.name, count: share(p) } })),
  );
  options.progress(`cluster-scale: ${samples} creates at ${shape.hold} live`);
  const full = await timed(project.name, `at_${shape.hold}_live`);
  return {
    [`create_p50_ms_at_${shape.hold}_live_vs_0`]: compared(quantile(full, 0.5), quantile(atZero, 0.5)),
    [`create_p99_ms_at_${shape.hold}_live_vs_0`]: compared(quantile(full, 0.99), quantile(atZero, 0.99)),
    at_size_refused_within_quota: { value: refused, unit: 'creates' },
    ...profiles,
  };
}
