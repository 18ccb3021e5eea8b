import type { DockerfileBuildOptions, DockerfileBuildResult } from './layer-build/dockerfile-build.ts';
import type { Environment, ProjectStore } from './store/layer-store.ts';
import type { PlatformClient, Sandbox } from './platform-client.ts';
import type { WarmPoolPolicy } from '../backends/index.ts';

/** Sandboxes on one private network, reaching each other by address (a task and its services). */
export interface SandboxGroupNetwork {
  /** Puts a live sandbox on the group; returns its address there. */
  join(sandbox: Sandbox): Promise<string>;
  /** Takes the member at `address` off the group. */
  leave(address: string): Promise<void>;
  close(): Promise<void>;
}

/**
 * What a platform that runs sandboxes on this host offers beyond the client API: building
 * environments into its store, private networks between sandboxes, and adopting the sandboxes a
 * crashed predecessor left. The embedded platform has it; a cluster client does not.
 */
export interface HostPlatform extends PlatformClient {
  readonly store: ProjectStore;
  buildFromDockerfile(options: DockerfileBuildOptions): Promise<DockerfileBuildResult>;
  /** An image as an environment: from the store, a stand-in, or a registry. */
  resolveImage(image: string): Promise<{ environment: Environment; notes: string[] }>;
  createGroupNetwork(): Promise<SandboxGroupNetwork>;
  /** Adopts the durable sandboxes a crashed predecessor on this data dir left running. */
  adoptSandboxes(): Promise<Sandbox[]>;
  /** The warm pool of container shells: a batch raises its targets to its concurrency. */
  readonly warmPool: { grow(policy: WarmPoolPolicy): void };
}

/** The platform as a {@link HostPlatform}, when it runs sandboxes on this host; else undefined. */
export function hostPlatformOf(platform: PlatformClient): HostPlatform | undefined {
  const candidate = platform as Partial<HostPlatform>;
  return typeof candidate.buildFromDockerfile === 'function' &&
    typeof candidate.createGroupNetwork === 'function' &&
    typeof candidate.adoptSandboxes === 'function' &&
    candidate.store !== undefined
    ? (platform as HostPlatform)
    : undefined;
}
