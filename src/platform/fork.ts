import { randomBytes } from 'node:crypto';
import { SandgymError, settleAll } from '../common/index.ts';
import { callOptionsOf } from '../backends/index.ts';
import type { ForkOptions, PlatformClient, Sandbox, SandboxGroup } from './platform-client.ts';
import { RUN_LABEL } from './runs.ts';

/** Where a sandbox's processes read which fork they are in (agent/agent.c writes it for memory forks). */
const FORK_FILE = '/run/sandgym/fork';

/**
 * fork(n): n sandboxes that start from `source`'s current files, with its resources and run, each
 * with a fork value of its own (see PlatformClient.fork), not the one the source's files hold. Its
 * changes become one unnamed layer in the shared store (layer gc reclaims it once unused), stacked
 * over its environment, so the copies may land on any node. All or nothing: if any copy cannot
 * be created, the others are destroyed and the error is thrown.
 */
export async function forkSandbox(
  platform: PlatformClient,
  source: Sandbox,
  count: number,
  options: ForkOptions = {},
): Promise<SandboxGroup> {
  const call = callOptionsOf(options);
  const environment = source.labels['environment'];
  if (!environment) {
    throw new SandgymError(
      'unsupported',
      `Sandbox ${source.id} was not made from an environment, so it cannot be forked`,
    );
  }
  const base = await platform.getEnvironment(environment, call);
  const { layer } = await platform.packDiff(source, call);
  // what the source already stacked over its environment (a checkpoint, a grader's diff), then its changes
  const extraLayers = [...source.layers.slice(base.layers.length).map((l) => l.digest), layer.digest];
  const run = source.labels[RUN_LABEL];
  const created = await Promise.allSettled(
    Array.from({ length: count }, async () => {
      const fork = randomBytes(16).toString('hex');
      const sandbox = await platform.createSandbox(
        {
          backend: source.backend,
          environment,
          extraLayers,
          resources: { ...source.resources },
          env: { SANDGYM_FORK: fork },
          ...(run ? { run } : {}),
        },
        call,
      );
      try {
        await sandbox.writeFile(FORK_FILE, fork, call);
      } catch (error) {
        await sandbox.close().catch(() => undefined);
        throw error;
      }
      return sandbox;
    }),
  );
  const sandboxes = created.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = created.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  const group = sandboxGroup(sandboxes);
  if (failed) {
    await group.close().catch(() => undefined);
    throw failed.reason;
  }
  return group;
}

/** Sandboxes closed as one. */
export function sandboxGroup(sandboxes: readonly Sandbox[]): SandboxGroup {
  const close = (): Promise<void> =>
    settleAll(
      sandboxes.map((s) => s.close()),
      'Some sandboxes of the fork group were not destroyed',
    );
  return { sandboxes, close, [Symbol.asyncDispose]: close };
}
