import type { z } from 'zod';

/** Messages a method accepts beyond this many bytes are rejected before they are decoded. */
export const DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024;

/** One RPC: its shape on the wire. Both ends validate what they receive against these schemas. */
export interface MethodDef<Req extends z.ZodType = z.ZodType, Res extends z.ZodType = z.ZodType> {
  /** `unary`: one request, one response. `server_stream`: one request, a stream of responses. */
  kind: 'unary' | 'server_stream';
  request: Req;
  response: Res;
  /** Default {@link DEFAULT_MAX_REQUEST_BYTES}. */
  maxRequestBytes?: number;
  /**
   * Who may call it: any authenticated `project` (the default), or only the node's `operator`
   * (see Principal.isOperator); a tenant gets `permission_denied`.
   */
  access?: 'project' | 'operator';
  /** One line for docs/wire.md and --help. */
  summary: string;
}

/** A gRPC service defined in TypeScript: method paths are `/<name>/<method>`. */
export interface ServiceDef<M extends Record<string, MethodDef> = Record<string, MethodDef>> {
  name: string;
  methods: M;
}

export function methodPath(service: ServiceDef, method: string): string {
  return `/${service.name}/${method}`;
}

/** Typing helpers for a method's decoded request and the response a handler may return. */
export type RequestOf<M extends MethodDef> = z.output<M['request']>;
export type ResponseOf<M extends MethodDef> = z.output<M['response']>;

/** A helper that keeps each method's literal kind for {@link ServiceDef} inference. */
export function unary<Req extends z.ZodType, Res extends z.ZodType>(
  def: Omit<MethodDef<Req, Res>, 'kind'>,
): MethodDef<Req, Res> & { kind: 'unary' } {
  return { ...def, kind: 'unary' };
}

export function serverStream<Req extends z.ZodType, Res extends z.ZodType>(
  def: Omit<MethodDef<Req, Res>, 'kind'>,
): MethodDef<Req, Res> & { kind: 'server_stream' } {
  return { ...def, kind: 'server_stream' };
}
