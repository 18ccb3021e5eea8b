import type { BackendSandbox, CallOptions, GcReport, SandboxRecord } from '../backends/index.ts';
import type { Environment } from './layer-store.ts';
import type { SandboxRequest } from './sandbox-request.ts';

/** A live sandbox, whichever backend runs it. */
export type Sandbox = BackendSandbox;

/**
 * What every way of running sandgym offers: the embedded platform in this process today, the
 * cluster client later. Layers above see only this.
 */
export interface PlatformClient extends AsyncDisposable {
  createSandbox(request?: SandboxRequest, options?: CallOptions): Promise<Sandbox>;
  listSandboxes(options?: CallOptions): Promise<SandboxRecord[]>;
  killSandbox(id: string, options?: CallOptions): Promise<void>;
  /** Removes what crashed owners left behind. */
  gc(options?: CallOptions): Promise<GcReport>;
  listEnvironments(options?: CallOptions): Promise<Environment[]>;
  /** Destroys this client's sandboxes. Idempotent. */
  close(): Promise<void>;
}
