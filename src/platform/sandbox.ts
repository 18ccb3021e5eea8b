import type { BackendSandbox } from '../backends/index.ts';

/** A read-only layer under a sandbox, as a client sees it: its digest and size, not where a node keeps it. */
export interface SandboxLayer {
  digest: string;
  sizeBytes?: number;
}

/**
 * A live sandbox, whichever backend runs it and wherever: what a client holds. The node-side
 * parts of a backend's handle (layer paths on the host, its writable layer as a host folder,
 * lifetime reclaim) stay on the node.
 */
export interface Sandbox extends Omit<
  BackendSandbox,
  'layers' | 'withWritableLayer' | 'expiresAt' | 'reclaim'
> {
  /** The layers under it, base first. */
  readonly layers: readonly SandboxLayer[];
}
