import { definedFields } from '../common/index.ts';
import type { CallOptions } from './contract.ts';

/** Just the cancellation part of an options bag (signal, deadline), without undefined fields. */
export function callOptionsOf({ signal, timeoutMs }: CallOptions): CallOptions {
  return definedFields({ signal, timeoutMs });
}
