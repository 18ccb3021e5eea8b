import type { CallOptions, GcReport, SandboxRecord } from '../../backends/index.ts';
import type { StepLog } from '../exactly-once.ts';
import { forkSandbox, sandboxGroup } from '../fork.ts';
import type { HostPlatform, SandboxGroupNetwork } from '../host-platform.ts';
import type { DockerfileBuildOptions, DockerfileBuildResult } from '../layer-build/dockerfile-build.ts';
import type { Environment, ProjectStore } from '../store/layer-store.ts';
import type { LocalPlatform } from '../local-platform.ts';
import type {
  ForkOptions,
  LayerGcOptions,
  LayerGcReport,
  PackDiffOptions,
  PackDiffResult,
  Sandbox,
  SandboxGroup,
} from '../platform-client.ts';
import type { Run, RunOptions } from '../runs.ts';
import { PROJECT_LABEL } from '../runs.ts';
import type { SandboxRequest } from '../sandbox-request.ts';
import type { StepReply, StepRequest } from '../steps/step-types.ts';

/** What a node agent lends a project's in-process client: its admission and its ownership checks. */
export interface NodeForProject {
  readonly platform: LocalPlatform;
  create(project: string, request: SandboxRequest, options: CallOptions): Promise<Sandbox>;
  /** Memory-depth copies of a sandbox of `project`, admitted as creates are. */
  forkInMemory(project: string, id: string, count: number, options: ForkOptions): Promise<Sandbox[]>;
  /** A live sandbox of `project`; another project's is `not_found`. */
  sandboxOf(project: string, id: string): Sandbox;
  destroy(project: string, id: string): Promise<void>;
}

/**
 * One project's view of a node, in the node's own process: what the node serves over the wire to
 * that project, without the wire. Environments served by the node (see the Envs service) run on
 * it, so their sandboxes go through the node's admission and stay within the project.
 */
export class NodeProjectClient implements HostPlatform {
  private readonly created = new Set<Sandbox>();
  readonly store: ProjectStore;

  constructor(
    private readonly node: NodeForProject,
    readonly project: string,
  ) {
    this.store = node.platform.storeFor(project);
  }

  /** Builds into this project's environments and step cache, as a build on the node would. */
  buildFromDockerfile(options: DockerfileBuildOptions): Promise<DockerfileBuildResult> {
    return this.node.platform.buildFromDockerfileFor(this.project, options);
  }

  resolveImage(image: string): Promise<{ environment: Environment; notes: string[] }> {
    return this.node.platform.resolveImageFor(this.project, image);
  }

  createGroupNetwork(): Promise<SandboxGroupNetwork> {
    return this.node.platform.createGroupNetwork();
  }

  /** None: the node adopted its predecessor's sandboxes when it started. */
  adoptSandboxes(): Promise<Sandbox[]> {
    return Promise.resolve([]);
  }

  /** The node's own: its operator sizes it (`--warm-pool`), not one project's batch. */
  readonly warmPool = { grow: (): void => undefined };

  async createSandbox(request: SandboxRequest = {}, options: CallOptions = {}): Promise<Sandbox> {
    const sandbox = await this.node.create(this.project, request, options);
    // an env that resets many times made many: keep only those still there
    for (const earlier of this.created) if (earlier.state === 'stopped') this.created.delete(earlier);
    this.created.add(sandbox);
    return sandbox;
  }

  async listSandboxes(): Promise<SandboxRecord[]> {
    return (await this.node.platform.listSandboxes()).filter(
      (record) => record.labels[PROJECT_LABEL] === this.project,
    );
  }

  attachSandbox(id: string): Promise<Sandbox> {
    return Promise.resolve(this.node.sandboxOf(this.project, id));
  }

  killSandbox(id: string): Promise<void> {
    return this.node.destroy(this.project, id);
  }

  gc(): Promise<GcReport> {
    return this.node.platform.gcFor(this.project);
  }

  layerGc(options: LayerGcOptions = {}): Promise<LayerGcReport> {
    return this.node.platform.layerGcFor(this.project, { ...options, nodeWide: false });
  }

  listEnvironments(): Promise<Environment[]> {
    return this.store.listEnvironments();
  }

  getEnvironment(ref: string): Promise<Environment> {
    return this.store.getEnvironment(ref);
  }

  packDiff(sandbox: Sandbox | string, options: PackDiffOptions): Promise<PackDiffResult> {
    const id = typeof sandbox === 'string' ? sandbox : sandbox.id;
    return this.node.platform.packDiff(this.node.sandboxOf(this.project, id), options);
  }

  stepLog(sandboxId: string): Promise<StepLog> {
    this.node.sandboxOf(this.project, sandboxId);
    return this.node.platform.stepLog(sandboxId);
  }

  step(sandbox: Sandbox, request: StepRequest, options: CallOptions = {}): Promise<StepReply> {
    return this.node.platform.step(this.node.sandboxOf(this.project, sandbox.id), request, options);
  }

  startRun(options: RunOptions): Promise<Run> {
    return this.node.platform.startRunFor(this.project, options);
  }

  async fork(sandbox: Sandbox, count: number, options: ForkOptions = {}): Promise<SandboxGroup> {
    if (options.depth !== 'memory') return forkSandbox(this, sandbox, count, options);
    const copies = await this.node.forkInMemory(this.project, sandbox.id, count, options);
    for (const copy of copies) this.created.add(copy);
    return sandboxGroup(copies);
  }

  /** Destroys the sandboxes this client created that are still there. */
  async close(): Promise<void> {
    const created = [...this.created];
    this.created.clear();
    await Promise.all(created.map((sandbox) => sandbox.close().catch(() => undefined)));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
