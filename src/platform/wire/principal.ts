import type { Metadata } from '@grpc/grpc-js';

/** Who is calling, as {@link Authenticate} decided from the call's metadata. */
export interface Principal {
  /** The project whose sandboxes and quota the call may touch. */
  project: string;
  /**
   * The node's operator: a holder of the node token calling for no project in particular (not
   * a controller acting for a tenant). Only the operator may call node-wide methods.
   */
  isOperator: boolean;
}

/** Decides who a call is from, or throws `unauthenticated`. */
export type Authenticate = (metadata: Metadata, path: string) => Principal;
