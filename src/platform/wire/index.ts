/** The wire protocol: gRPC services defined in TypeScript, msgpack messages validated by zod. */
export { WireServer, register } from './server.ts';
export type { Authenticate, CallContext, Handlers, IdResolvers, Principal, Registration } from './server.ts';
export { WireClient } from './client.ts';
export type { WireCallOptions, WireClientOptions } from './client.ts';
export {
  bearerToken,
  checkTokenStrength,
  tokenAuthenticator,
  tokenDigest,
  quotaOf,
  networkGrantOf,
  storeQuotaOf,
  NETWORK_GRANT_KEY,
  PROJECT_KEY,
  QUOTA_KEY,
  STORE_QUOTA_KEY,
} from './auth.ts';
export { readTlsFiles } from './tls.ts';
export { tlsMismatch } from './tls-diagnosis.ts';
export { RequestBudget, DEFAULT_IN_FLIGHT_BYTES } from './request-budget.ts';
export type { TlsFiles, TlsPaths } from './tls.ts';
export { ENVS, SANDBOXES, NODE, RUNS } from './services.ts';
export type { ChatOptions, EnvSpec } from './env-messages.ts';
export { chatOptions, envSpec as envSpecSchema } from './env-messages.ts';
export type { DrainProgress, SandboxInfo, NodeStatus, ExecEvent, ExecRequest } from './messages.ts';
export { expectedPhaseMs } from './messages.ts';
export { decodeMessage, encodeMessage } from './decode.ts';
export { methodPath } from './service.ts';
export type { MethodDef, ServiceDef } from './service.ts';
export { STATUS_OF_CODE } from './status.ts';
