/**
 * A process of simulated nodes for `sandgym bench cluster-scale` (see node-simulator.ts: a
 * benchmark's stand-in for node agents, never a backend). Started as
 * `node node-simulator-process.js '<config JSON>'` with SANDGYM_NODE_TOKEN in its environment,
 * it starts the nodes on one etcd connection, prints one JSON line (`{"nodes": [...]}`) when they
 * are registered, then answers one JSON line per command line on stdin:
 * `{"stats": true}` (live records and quota conflicts), `{"quotasOff": BOOL}`,
 * `{"preload": {"project": P, "count": N}}` (spread over its nodes). It leaves etcd and exits when
 * stdin closes or on SIGTERM.
 */
import { createInterface } from 'node:readline';
import { z } from 'zod';
import { createLogger } from '../src/common/index.ts';
import { connectEtcd } from '../src/platform/index.ts';
import { SimulatedNode, type SimulatorOptions } from './node-simulator.ts';

const configSchema = z.strictObject({
  endpoints: z.array(z.string()).min(1),
  /** Node ids are `<prefix><index>`, indexes `first` to `first + count - 1`. */
  prefix: z.string().regex(/^[a-z]+$/),
  first: z.number().int().nonnegative(),
  count: z.number().int().positive(),
  capacity: z.number().int().positive(),
  createLatencyMs: z.number().nonnegative(),
  quotasOff: z.boolean(),
  leaseTtlSeconds: z.number().int().positive(),
});
export type SimulatorProcessConfig = z.infer<typeof configSchema>;

const commandSchema = z.union([
  z.strictObject({ stats: z.literal(true) }),
  z.strictObject({ quotasOff: z.boolean() }),
  z.strictObject({
    preload: z.strictObject({ project: z.string().min(1), count: z.number().int().nonnegative() }),
  }),
]);
export type SimulatorCommand = z.infer<typeof commandSchema>;

async function main(): Promise<void> {
  const config = configSchema.parse(JSON.parse(process.argv[2] ?? ''));
  const token = process.env['SANDGYM_NODE_TOKEN'];
  if (!token) throw new Error('set SANDGYM_NODE_TOKEN');
  const logger = createLogger({ level: 'error' });
  const options: SimulatorOptions = { ...config, token, capacity: config.capacity, logger };
  // one connection for the process's nodes: each still holds its own lease and keys
  const etcd = await connectEtcd({ endpoints: config.endpoints });
  const nodes: SimulatedNode[] = [];
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> =>
    (closing ??= (async () => {
      await Promise.all(nodes.map((node) => node.close().catch(() => undefined)));
      etcd.close();
    })());
  process.once('SIGTERM', () => void close().then(() => process.exit(0)));
  try {
    for (let i = config.first; i < config.first + config.count; i++)
      nodes.push(await SimulatedNode.start(etcd, `${config.prefix}${i}`, options));
  } catch (error) {
    await close();
    throw error;
  }
  console.log(JSON.stringify({ nodes: nodes.map((node) => node.nodeId) }));
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    const command = commandSchema.parse(JSON.parse(line));
    if ('stats' in command) {
      console.log(
        JSON.stringify({
          live: nodes.reduce((sum, node) => sum + node.live, 0),
          conflicts: nodes.reduce((sum, node) => sum + node.quota.profile.conflicts, 0),
          profile: summed(nodes.map((node) => ({ ...node.quota.profile, ...node.timing }))),
        }),
      );
    } else if ('quotasOff' in command) {
      options.quotasOff = command.quotasOff;
      console.log(JSON.stringify({ quotasOff: options.quotasOff }));
    } else {
      const { project, count } = command.preload;
      await Promise.all(
        nodes.map((node, i) =>
          node.preload(project, Math.floor(count / nodes.length) + (i < count % nodes.length ? 1 : 0)),
        ),
      );
      console.log(JSON.stringify({ preloaded: count }));
    }
  }
  await close();
}

/** Each field summed over the nodes. */
function summed(parts: Record<string, number>[]): Record<string, number> {
  const total: Record<string, number> = {};
  for (const part of parts)
    for (const [key, value] of Object.entries(part)) total[key] = (total[key] ?? 0) + value;
  return total;
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
