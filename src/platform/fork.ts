import { SandgymError, settleAll } from '../common/index.ts';
import type { CallOptions } from '../backends/index.ts';
import type { PlatformClient, Sandbox, SandboxGroup } from './platform-client.ts';
import { RUN_LABEL } from './runs.ts';

/**
 * fork(n): n sandboxes that start from `source`'s current files, with its resources and run. Its
 * changes become one unnamed layer in the shared store (layer gc reclaims it once unused), stacked
 * over its environment, so the copies may land on any node. All or nothing: if any copy cannot
 * be created, the others are destroyed and the error is thrown.
 */
export async function forkSandbox(
  platform: PlatformClient,
  source: Sandbox,
  count: number,
  options: CallOptions = {},
): Promise<SandboxGroup> {
  const environment = source.labels['environment'];
  if (!environment) {
    throw new SandgymError(
      'unsupported',
      `Sandbox ${source.id} was not made from an environment, so it cannot be forked`,
    );
  }
  const base = await platform.getEnvironment(environment, options);
  const { layer } = await platform.packDiff(source, options);
  // what the source already stacked over its environment (a checkpoint, a grader's diff), then its changes
  const extraLayers = [...source.layers.slice(base.layers.length).map((l) => l.digest), layer.digest];
  const run = source.labels[RUN_LABEL];
  const created = await Promise.allSettled(
    Array.from({ length: count }, () =>
      platform.createSandbox(
        {
          backend: source.backend,
          environment,
          extraLayers,
          resources: { ...source.resources },
          ...(run ? { run } : {}),
        },
        options,
      ),
    ),
  );
  const sandboxes = created.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = created.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  const close = (): Promise<void> =>
    settleAll(
      sandboxes.map((s) => s.close()),
      'Some sandboxes of the fork group were not destroyed',
    );
  if (failed) {
    await close().catch(() => undefined);
    throw failed.reason;
  }
  return { sandboxes, close, [Symbol.asyncDispose]: close };
}
