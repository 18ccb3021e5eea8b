import { randomBytes } from 'node:crypto';
import { settleAll } from '../common/index.ts';
import type { CallOptions } from '../backends/index.ts';
import type { PlatformClient, Sandbox, SandboxGroup } from './platform-client.ts';
import { RUN_LABEL } from './runs.ts';

/**
 * fork(n): n sandboxes that start from `source`'s current files (its changes become a layer in
 * the shared store, so the copies may land on any node), with its resources and run. All or
 * nothing: if any copy cannot be created, the others are destroyed and the error is thrown.
 */
export async function forkSandbox(
  platform: PlatformClient,
  source: Sandbox,
  count: number,
  options: CallOptions = {},
): Promise<SandboxGroup> {
  const name = `fork-${source.id.replace(/^sg-/, '')}:${randomBytes(4).toString('hex')}`;
  await platform.packDiff(source, { name, description: `fork of ${source.id}`, ...options });
  const run = source.labels[RUN_LABEL];
  const created = await Promise.allSettled(
    Array.from({ length: count }, () =>
      platform.createSandbox(
        {
          backend: source.backend,
          environment: name,
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
